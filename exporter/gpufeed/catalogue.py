"""The metric catalogue: every family gpufeed exports, once, with its type, labels, unit and HELP.

This module is the metrics contract. The collectors, the simulated node, the correlator's
outputs, docs/metrics.md (its tables are generated from here), and the dashboard and alert
checks all derive from it or are tested against it (tests/test_catalogue.py): a family that
is exported but not listed here, or listed with other HELP, type or labels, fails a test that
names it. A `contract` family is public interface (dashboards, alerts and `gpufeed analyze`
may depend on it): renaming one is a breaking change and needs a CHANGELOG note.

`labels` lists every label a sample of the family may carry, in the order the docs show
them; a sample may leave out a label that is marked optional in `optional_labels`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from gpufeed.model import MetricType
from gpufeed.vocabulary import PARALLEL_LABELS

Group = Literal[
    "gpu",
    "storage",
    "network",
    "host",
    "jobs",
    "serving",
    "correlator",
    "fleet",
    "scheduler",
    "agent",
]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One exported family. For counters `name` carries `_total`, as the exposition shows it."""

    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...]
    unit: str  # the base unit in the name ("bytes", "seconds", "ratio", ...), "" for counts
    group: Group
    source: str  # what produces it: a collector's name, "sampler" or "correlator"
    contract: bool = True
    optional_labels: tuple[str, ...] = ()


GPU = ("gpu", "uuid")
MOUNT = ("tier", "mountpoint", "device")
PORT = ("device", "fabric", "port")
K8S_POD = ("k8s_namespace_name", "k8s_pod_name", "k8s_container_name")


def _gpu(name: str, type_: MetricType, help_: str, unit: str, *extra: str) -> MetricSpec:
    return MetricSpec(name, type_, help_, (*GPU, *extra), unit, "gpu", "gpu")


def _gpu_extra(name: str, type_: MetricType, help_: str, unit: str) -> MetricSpec:
    return MetricSpec(name, type_, help_, GPU, unit, "gpu", "gpu", contract=False)


def _mount(name: str, type_: MetricType, help_: str, unit: str) -> MetricSpec:
    # `device` only where the mount is a block device (NFS has none).
    return MetricSpec(name, type_, help_, MOUNT, unit, "storage", "storage", True, ("device",))


def _port(name: str, type_: MetricType, help_: str, unit: str) -> MetricSpec:
    # `port` only for RDMA ports (InfiniBand, RoCE).
    return MetricSpec(name, type_, help_, PORT, unit, "network", "network", True, ("port",))


def _port_counter(name: str, help_: str) -> MetricSpec:
    # one series per kernel counter name; `port` only for RDMA ports
    labels = (*PORT, "counter")
    return MetricSpec(name, "counter", help_, labels, "", "network", "network", True, ("port",))


def _object(name: str, help_: str, labels: tuple[str, ...], unit: str, group: Group) -> MetricSpec:
    # Object-storage tiers (issue 16), from the SDK collector: counters. The per-tier ones
    # are in the contract (the simulated node has an object tier); the per-job ones not yet:
    # no simulated job reads from it (tests/test_catalogue.py).
    return MetricSpec(name, "counter", help_, labels, unit, group, "sdk", group == "storage")


def _fleet(
    name: str,
    type_: MetricType,
    help_: str,
    labels: tuple[str, ...],
    unit: str,
    *,
    optional: tuple[str, ...] = (),
    contract: bool = True,
) -> MetricSpec:
    return MetricSpec(name, type_, help_, labels, unit, "fleet", "fleet", contract, optional)


def _sched(
    name: str, type_: MetricType, help_: str, labels: tuple[str, ...], unit: str
) -> MetricSpec:
    return MetricSpec(name, type_, help_, labels, unit, "scheduler", "scheduler")


def _fabric(name: str, help_: str, unit: str) -> MetricSpec:
    # `peer` is the peer node's address; one series per node with `peer` left out
    labels = ("peer",)
    return MetricSpec(name, "gauge", help_, labels, unit, "network", "fabric", True, labels)


# A serving endpoint (docs/serving.md): its job and/or one GPU it serves on (a config entry
# for GPUs gives one series per GPU), its stack where known, and host:port.
SERVING = ("job_id", "gpu", "server", "endpoint")


def _serving(name: str, type_: MetricType, help_: str, unit: str) -> MetricSpec:
    optional = ("job_id", "gpu", "server")
    return MetricSpec(name, type_, help_, SERVING, unit, "serving", "serving", True, optional)


CATALOGUE: tuple[MetricSpec, ...] = (
    # GPU
    _gpu(
        "gpufeed_gpu_info",
        "gauge",
        "GPU identity; backend is nvml or simulated.",
        "",
        "name",
        "driver_version",
        "pci_bus_id",
        "backend",
    ),
    _gpu(
        "gpufeed_gpu_up",
        "gauge",
        "1 while the GPU answers, 0 once it is lost (XID 79, off the bus).",
        "",
    ),
    _gpu(
        "gpufeed_gpu_utilization_ratio",
        "gauge",
        "Fraction of the last sample period in which a kernel ran (NVML utilization.gpu / 100).",
        "ratio",
    ),
    _gpu(
        "gpufeed_gpu_sm_active_ratio",
        "gauge",
        "Fraction of SMs busy over the last interval (NVML GPM, Hopper and newer).",
        "ratio",
    ),
    _gpu(
        "gpufeed_gpu_memory_bandwidth_utilization_ratio",
        "gauge",
        "Fraction of time device memory was being read or written, a time fraction and not "
        "bandwidth (NVML utilization.memory / 100).",
        "ratio",
    ),
    _gpu(
        "gpufeed_gpu_memory_used_bytes",
        "gauge",
        "Framebuffer memory in use, without the driver's reserved memory (as nvidia-smi).",
        "bytes",
    ),
    _gpu("gpufeed_gpu_memory_total_bytes", "gauge", "Framebuffer memory size.", "bytes"),
    _gpu(
        "gpufeed_gpu_power_watts",
        "gauge",
        "Power draw (on Hopper and newer NVML gives a 1 s average).",
        "watts",
    ),
    _gpu(
        "gpufeed_gpu_energy_joules_total",
        "counter",
        "Energy consumed since the driver was loaded.",
        "joules",
    ),
    _gpu("gpufeed_gpu_temperature_celsius", "gauge", "GPU core temperature.", "celsius"),
    _gpu("gpufeed_gpu_sm_clock_hertz", "gauge", "SM clock.", "hertz"),
    _gpu(
        "gpufeed_gpu_clock_event_active",
        "gauge",
        "1 while the clock event reason is active, else 0.",
        "",
        "reason",
    ),
    _gpu(
        "gpufeed_gpu_pcie_transmit_bytes_total",
        "counter",
        "PCIe bytes sent by the GPU (device to host).",
        "bytes",
    ),
    _gpu(
        "gpufeed_gpu_pcie_receive_bytes_total",
        "counter",
        "PCIe bytes received by the GPU (host to device).",
        "bytes",
    ),
    _gpu(
        "gpufeed_gpu_nvlink_transmit_bytes_total",
        "counter",
        "NVLink data bytes sent, summed over links.",
        "bytes",
    ),
    _gpu(
        "gpufeed_gpu_nvlink_receive_bytes_total",
        "counter",
        "NVLink data bytes received, summed over links.",
        "bytes",
    ),
    _gpu(
        "gpufeed_gpu_xid_errors_total",
        "counter",
        "XID error events seen since the agent started.",
        "",
        "xid",
    ),
    MetricSpec(
        "gpufeed_gpu_mig_enabled",
        "gauge",
        "1 when MIG mode is enabled on the physical GPU, else 0.",
        GPU,
        "",
        "gpu",
        "gpu",
        contract=False,
    ),
    _gpu_extra(
        "gpufeed_gpu_busy_seconds_total",
        "counter",
        "Utilization summed over time by the agent: rate() is the mean utilization over "
        "every sample in the range, not only the last one.",
        "seconds",
    ),
    _gpu_extra(
        "gpufeed_gpu_sm_occupancy_ratio",
        "gauge",
        "Resident warps over the theoretical maximum, last interval (NVML GPM, Hopper+).",
        "ratio",
    ),
    _gpu_extra(
        "gpufeed_gpu_tensor_active_ratio",
        "gauge",
        "Fraction of time the SMs ran any tensor-core instruction (NVML GPM, Hopper+).",
        "ratio",
    ),
    _gpu_extra(
        "gpufeed_gpu_dram_bandwidth_utilization_ratio",
        "gauge",
        "Device memory bandwidth used over its peak, last interval (NVML GPM, Hopper+).",
        "ratio",
    ),
    _gpu_extra(
        "gpufeed_gpu_memory_reserved_bytes",
        "gauge",
        "Framebuffer memory the driver reserves for itself.",
        "bytes",
    ),
    # Storage tiers
    # Object-storage tiers: the node's sums over every job that reported requests (the
    # requests of jobs that ended stay counted).
    _object(
        "gpufeed_object_storage_requests_total",
        "Object-storage requests this node's jobs made per tier and operation (read, write, "
        "metadata), failed ones included",
        ("tier", "operation"),
        "",
        "storage",
    ),
    _object(
        "gpufeed_object_storage_request_seconds_total",
        "Time this node's object-storage requests took, request sent to response headers "
        "(rate over the requests' rate: mean request latency)",
        ("tier", "operation"),
        "seconds",
        "storage",
    ),
    _object(
        "gpufeed_object_storage_read_bytes_total",
        "Bytes this node's jobs read from an object-storage tier (response Content-Length "
        "of successful reads)",
        ("tier",),
        "bytes",
        "storage",
    ),
    _object(
        "gpufeed_object_storage_written_bytes_total",
        "Bytes this node's jobs wrote to an object-storage tier (request bodies sent)",
        ("tier",),
        "bytes",
        "storage",
    ),
    _object(
        "gpufeed_object_storage_errors_total",
        "Object-storage requests that failed: throttled (HTTP 503 SlowDown, 429) or failed "
        "(any other error status, or no answer)",
        ("tier", "operation", "reason"),
        "",
        "storage",
    ),
    _mount(
        "gpufeed_storage_read_bytes_total",
        "counter",
        "Bytes read from the mount's device (over the wire for NFS).",
        "bytes",
    ),
    _mount(
        "gpufeed_storage_written_bytes_total",
        "counter",
        "Bytes written to the mount's device (over the wire for NFS).",
        "bytes",
    ),
    _mount(
        "gpufeed_storage_reads_completed_total",
        "counter",
        "Read operations completed (NFS: READ RPCs).",
        "",
    ),
    _mount(
        "gpufeed_storage_writes_completed_total",
        "counter",
        "Write operations completed (NFS: WRITE RPCs).",
        "",
    ),
    _mount(
        "gpufeed_storage_read_time_seconds_total",
        "counter",
        "Time spent on reads (NFS: READ execute time).",
        "seconds",
    ),
    _mount(
        "gpufeed_storage_write_time_seconds_total",
        "counter",
        "Time spent on writes (NFS: WRITE execute time).",
        "seconds",
    ),
    _mount(
        "gpufeed_storage_io_time_seconds_total",
        "counter",
        "Time the block device was busy with I/O.",
        "seconds",
    ),
    _mount(
        "gpufeed_storage_io_time_weighted_seconds_total",
        "counter",
        "In-flight-weighted I/O time; its rate is the mean queue depth.",
        "seconds",
    ),
    _mount(
        "gpufeed_storage_capacity_bytes",
        "gauge",
        "Filesystem size (statvfs f_blocks * f_frsize).",
        "bytes",
    ),
    _mount(
        "gpufeed_storage_free_bytes",
        "gauge",
        "Space available to unprivileged users (statvfs f_bavail * f_frsize).",
        "bytes",
    ),
    MetricSpec(
        "gpufeed_storage_mount_info",
        "gauge",
        "The exported mount: filesystem type, source, device kind and the disks below it.",
        (*MOUNT, "fstype", "source", "kind", "disks"),
        "",
        "storage",
        "storage",
        contract=False,
        optional_labels=("device", "disks"),
    ),
    MetricSpec(
        "gpufeed_storage_mount_stuck",
        "gauge",
        "1 while a statvfs on the mount has not answered within the time bound.",
        MOUNT,
        "",
        "storage",
        "storage",
        contract=False,
        optional_labels=("device",),
    ),
    MetricSpec(
        "gpufeed_storage_nfs_rtt_seconds_total",
        "counter",
        "NFS round-trip time summed over READ or WRITE RPCs (op label).",
        ("tier", "mountpoint", "op"),
        "seconds",
        "storage",
        "storage",
        contract=False,
    ),
    MetricSpec(
        "gpufeed_storage_nfs_requested_read_bytes_total",
        "counter",
        "Bytes applications read from the NFS mount, cached or not (mountstats normal + "
        "direct read bytes); 1 - read_bytes_total / this is the client cache hit ratio.",
        ("tier", "mountpoint"),
        "bytes",
        "storage",
        "storage",
    ),
    MetricSpec(
        "gpufeed_storage_tier_target_read_latency_seconds",
        "gauge",
        "The tier's mean read latency target, from the config (tier_targets).",
        ("tier",),
        "seconds",
        "storage",
        "storage",
    ),
    MetricSpec(
        "gpufeed_storage_tier_target_read_bytes_per_second",
        "gauge",
        "The tier's read throughput target, from the config (tier_targets).",
        ("tier",),
        "bytes_per_second",
        "storage",
        "storage",
    ),
    MetricSpec(
        "gpufeed_storage_gds_operations_total",
        "counter",
        "GPUDirect Storage reads or writes (op label) through the nvidia-fs driver; absent "
        "where the driver is not loaded or its IO stats are disabled.",
        ("op",),
        "",
        "storage",
        "gds",
    ),
    MetricSpec(
        "gpufeed_storage_gds_bytes_total",
        "counter",
        "Bytes GPUDirect Storage read or wrote (op label), in whole MiB as nvidia-fs counts them.",
        ("op",),
        "bytes",
        "storage",
        "gds",
    ),
    MetricSpec(
        "gpufeed_storage_gds_errors_total",
        "counter",
        "Failed GPUDirect Storage reads or writes (op), by kind: io (the I/O failed) or "
        "io_state (the request was refused in a bad state).",
        ("op", "kind"),
        "",
        "storage",
        "gds",
    ),
    MetricSpec(
        "gpufeed_storage_gds_latency_seconds",
        "gauge",
        "Mean GPUDirect Storage latency per op over the driver's last second of I/O.",
        ("op",),
        "seconds",
        "storage",
        "gds",
    ),
    MetricSpec(
        "gpufeed_storage_gds_gpu_pinned_bytes",
        "gauge",
        "GPU memory pinned for GPUDirect Storage through BAR1 now (nvidia-fs Registered_MiB).",
        ("uuid", "pci_bus_id"),
        "bytes",
        "storage",
        "gds",
    ),
    MetricSpec(
        "gpufeed_storage_gds_gpu_bounce_buffer_bytes",
        "gauge",
        "GPU bounce-buffer memory GPUDirect Storage uses now (nvidia-fs Cache_MiB): I/O that "
        "could not go directly to the application's buffer.",
        ("uuid", "pci_bus_id"),
        "bytes",
        "storage",
        "gds",
    ),
    MetricSpec(
        "gpufeed_storage_tier_path_missing",
        "gauge",
        "1 when a path configured for a tier does not exist.",
        ("tier", "path"),
        "",
        "storage",
        "storage",
        contract=False,
    ),
    # Network fabric
    _port(
        "gpufeed_network_receive_bytes_total",
        "counter",
        "Bytes received; for RDMA ports from the port counters, which RDMA traffic uses.",
        "bytes",
    ),
    _port(
        "gpufeed_network_transmit_bytes_total",
        "counter",
        "Bytes transmitted; for RDMA ports from the port counters, which RDMA traffic uses.",
        "bytes",
    ),
    _port(
        "gpufeed_network_speed_bytes_per_second",
        "gauge",
        "Link speed in bytes per second, while the link is up.",
        "bytes_per_second",
    ),
    _port(
        "gpufeed_network_shaped_rate_bytes_per_second",
        "gauge",
        "Rate the interface's root queueing discipline shapes what it sends to, in bytes per "
        "second: a tbf's rate, or the sum of an htb root's top-level class ceilings; only "
        "while one is set.",
        "bytes_per_second",
    ),
    _port(
        "gpufeed_network_transmit_wait_seconds_total",
        "counter",
        "Estimated time an InfiniBand port had data to send but could not (no credits): "
        "port_xmit_wait ticks, one tick being the time to send xmit_wait_tick_bytes at the "
        "link rate.",
        "seconds",
    ),
    _port(
        "gpufeed_network_link_up",
        "gauge",
        "1 while the link is up (an RDMA port ACTIVE, an interface with carrier), 0 while "
        "it is down.",
        "",
    ),
    _port_counter(
        "gpufeed_network_link_errors_total",
        "Link faults by the kernel's counter name: InfiniBand port counters (symbol_error, "
        "link_error_recovery, link_downed, port_rcv_errors, port_rcv_remote_physical_errors, "
        "local_link_integrity_errors, excessive_buffer_overrun_errors), RoCE hw_counters "
        "(out_of_sequence, packet_seq_err, implied_nak_seq_err, local_ack_timeout_err), "
        "Ethernet carrier_changes, rx_errors, tx_errors, rx_crc_errors; only those the "
        "hardware provides.",
    ),
    _port_counter(
        "gpufeed_network_congestion_packets_total",
        "Packets that signal congestion, by the kernel's counter name: InfiniBand "
        "port_xmit_discards, RoCE np_ecn_marked_roce_packets, np_cnp_sent, rp_cnp_handled; "
        "only those the hardware provides.",
    ),
    # Fabric latency from the kernel's socket diagnostics (collectors/fabric.py)
    _fabric(
        "gpufeed_fabric_rtt_seconds",
        "Smoothed round-trip time of the TCP connections of GPU-holding processes (tcp_info "
        "rtt, averaged over connections), per peer node and, without peer, for the node.",
        "seconds",
    ),
    _fabric(
        "gpufeed_fabric_rtt_jitter_seconds",
        "Round-trip time variation of those connections (tcp_info rttvar, the kernel's mean "
        "deviation of the RTT, averaged over connections): the jitter collectives wait on.",
        "seconds",
    ),
    _fabric(
        "gpufeed_fabric_connections",
        "TCP connections of GPU-holding processes behind the RTT series.",
        "",
    ),
    # Host
    MetricSpec(
        "gpufeed_host_cpu_seconds_total",
        "counter",
        "CPU time summed over all CPUs, by mode (guest time is inside user and nice).",
        ("mode",),
        "seconds",
        "host",
        "host",
    ),
    MetricSpec(
        "gpufeed_host_cpus",
        "gauge",
        "Logical CPUs online (cpuN lines of /proc/stat).",
        (),
        "",
        "host",
        "host",
    ),
    MetricSpec(
        "gpufeed_host_pressure_waiting_seconds_total",
        "counter",
        "PSI 'some': time in which at least one task waited on the resource.",
        ("resource",),
        "seconds",
        "host",
        "host",
    ),
    MetricSpec(
        "gpufeed_host_pressure_stalled_seconds_total",
        "counter",
        "PSI 'full': time in which all non-idle tasks were stalled on the resource.",
        ("resource",),
        "seconds",
        "host",
        "host",
    ),
    MetricSpec(
        "gpufeed_host_memory_available_bytes",
        "gauge",
        "MemAvailable: memory available for new work without swapping.",
        (),
        "bytes",
        "host",
        "host",
    ),
    # Inference serving
    _serving(
        "gpufeed_serving_up",
        "gauge",
        "1 when the last scrape of the serving endpoint answered with a queue metric gpufeed "
        "knows (vLLM, Triton, TGI) or the job reported its demand itself, else 0.",
        "",
    ),
    _serving(
        "gpufeed_serving_requests_waiting",
        "gauge",
        "Requests the serving stack has admitted and not yet scheduled (vLLM "
        "num_requests_waiting, Triton pending_request_count, TGI queue_size).",
        "",
    ),
    _serving(
        "gpufeed_serving_requests_running",
        "gauge",
        "Requests in the batch on the GPU now (vLLM num_requests_running, TGI "
        "batch_current_size); absent where the stack does not say (Triton).",
        "",
    ),
    _serving(
        "gpufeed_serving_kv_cache_usage_ratio",
        "gauge",
        "Share of the KV-cache blocks in use, 0..1 (vLLM kv_cache_usage_perc, before V1 "
        "gpu_cache_usage_perc); absent where the stack does not say.",
        "ratio",
    ),
    _serving(
        "gpufeed_serving_requests_completed_total",
        "counter",
        "Requests the serving stack completed successfully, as it counts them (vLLM "
        "request_success_total, Triton request_success, TGI request_success).",
        "",
    ),
    MetricSpec(
        "gpufeed_serving_scrape_failures_total",
        "counter",
        "Scrapes of the serving endpoint that failed, by reason (unreachable: no connection; "
        "timeout: no whole answer in serving.timeout_seconds; status: an HTTP error or not "
        "HTTP; redirect: a 3xx, never followed; too_large: a body over the limit; busy: not "
        "scraped, its last scrape still running or the threads held by slower endpoints; "
        "unrecognised: no queue metric in it).",
        ("job_id", "gpu", "endpoint", "reason"),
        "",
        "serving",
        "serving",
        contract=False,
        optional_labels=("job_id", "gpu"),
    ),
    # Jobs
    MetricSpec(
        "gpufeed_job_info",
        "gauge",
        "Which job holds which GPU (1); absent for a GPU no job holds",
        ("job_id", *GPU, "scheduler", "name", *K8S_POD),
        "",
        "jobs",
        "jobs",
        # a Kubernetes job's pod, where the kubelet's log directories name it
        optional_labels=K8S_POD,
    ),
    MetricSpec(
        "gpufeed_job_phase_seconds_total",
        "counter",
        "Time the job reported in each phase (job SDK)",
        ("job_id", "phase", "name"),
        "seconds",
        "jobs",
        "sdk",
        optional_labels=("name",),
    ),
    MetricSpec(
        "gpufeed_job_steps_total",
        "counter",
        "Training steps completed",
        ("job_id", "name"),
        "",
        "jobs",
        "sdk",
        optional_labels=("name",),
    ),
    MetricSpec(
        "gpufeed_job_processes",
        "gauge",
        "Processes that speak for the job now (0 once all have closed or exited, while its "
        "series stay for the grace period); a job that holds its devices but makes no "
        "steps is registered, not absent",
        ("job_id", "name"),
        "",
        "jobs",
        "sdk",
        optional_labels=("name",),
    ),
    MetricSpec(
        "gpufeed_job_model_load_seconds_total",
        "counter",
        "Time spent loading model weights (torch.load, safetensors, from_pretrained; SDK "
        "Job.load), by the storage tier the files were read from",
        ("job_id", "name", "tier"),
        "seconds",
        "jobs",
        "sdk",
        optional_labels=("name",),
    ),
    MetricSpec(
        "gpufeed_job_model_load_bytes_total",
        "counter",
        "Bytes of model weights loaded (the files' sizes), by the storage tier they were read from",
        ("job_id", "name", "tier"),
        "bytes",
        "jobs",
        "sdk",
        optional_labels=("name",),
    ),
    MetricSpec(
        "gpufeed_job_model_loading_bytes",
        "gauge",
        "Bytes of the model loads in progress now, by the storage tier they are read from "
        "(absent while none is)",
        ("job_id", "name", "tier"),
        "bytes",
        "jobs",
        "sdk",
        optional_labels=("name",),
    ),
    MetricSpec(
        "gpufeed_job_checkpoint_seconds",
        "histogram",
        "Checkpoint save durations",
        ("job_id", "name"),
        "seconds",
        "jobs",
        "sdk",
        optional_labels=("name",),
    ),
    MetricSpec(
        "gpufeed_job_checkpoint_written_bytes_total",
        "counter",
        "Checkpoint bytes written",
        ("job_id", "name"),
        "bytes",
        "jobs",
        "sdk",
        optional_labels=("name",),
    ),
    MetricSpec(
        "gpufeed_job_epoch_seconds",
        "histogram",
        "Epoch durations",
        ("job_id", "name"),
        "seconds",
        "jobs",
        "sdk",
        optional_labels=("name",),
    ),
    # Per rank (issue 13): only the ranks running on this node, at most 256 per job.
    MetricSpec(
        "gpufeed_job_rank_phase_seconds_total",
        "counter",
        "Time one rank of the job reported in each phase; collective_wait (time inside "
        "torch.distributed collectives and barriers) overlaps the other phases",
        ("job_id", "rank", "phase"),
        "seconds",
        "jobs",
        "sdk",
    ),
    MetricSpec(
        "gpufeed_job_rank_steps_total",
        "counter",
        "Training steps one rank of the job completed",
        ("job_id", "rank"),
        "",
        "jobs",
        "sdk",
    ),
    MetricSpec(
        "gpufeed_job_rank_info",
        "gauge",
        "A rank of the job running on this node (1): its local rank, the world size, "
        "the GPU it uses where known, and its parallelism coordinates where it reported "
        "them (data-parallel rank, pipeline stage, tensor/context/expert-parallel rank)",
        ("job_id", "rank", "local_rank", "world_size", "uuid", *PARALLEL_LABELS),
        "",
        "jobs",
        "sdk",
        # local_rank: absent where the launcher does not say; uuid: absent unless NVML
        # lists the rank's process on exactly one GPU; <dim>_rank: absent unless the rank
        # reported that dimension (SDK set_parallel, Megatron, gpufeed run --parallel-sizes)
        optional_labels=("local_rank", "uuid", *PARALLEL_LABELS),
    ),
    MetricSpec(
        "gpufeed_job_rank_lost",
        "gauge",
        "1 once every process of a rank of the job on this node has exited without closing "
        "its job (killed, crashed), 0 while it runs, after a clean close or an exit status 0 "
        "its launcher reported; kept while the job's series stay, back to 0 when a process "
        "registers the rank again",
        ("job_id", "rank"),
        "",
        "jobs",
        "sdk",
    ),
    MetricSpec(
        "gpufeed_job_rank_exit_status",
        "gauge",
        "Exit status of the rank's process as a shell gives it (128 + N: killed by signal "
        "N), where `gpufeed run` launched it and reported it; absent otherwise",
        ("job_id", "rank"),
        "",
        "jobs",
        "sdk",
        # not yet in the contract: no simulated rank exits (tests/test_catalogue.py)
        contract=False,
    ),
    MetricSpec(
        "gpufeed_job_storage_read_bytes_total",
        "counter",
        "Bytes the job read per storage tier (cgroup io accounting, else /proc/PID/io)",
        ("job_id", "tier"),
        "bytes",
        "jobs",
        "job_io",
    ),
    MetricSpec(
        "gpufeed_job_io_processes",
        "gauge",
        "Processes whose /proc/PID/io the job's `unattributed` read and written bytes sum now: "
        "those that speak for it and their live descendants (its input workers). Absent "
        "where its cgroup accounts its I/O; present, it says a worker's reads count before "
        "the worker exits, so a job counted reading nothing reads nothing",
        ("job_id",),
        "",
        "jobs",
        "job_io",
        # not in the contract: the simulated node's jobs are cgroup-accounted
        contract=False,
    ),
    MetricSpec(
        "gpufeed_job_storage_written_bytes_total",
        "counter",
        "Bytes the job wrote per storage tier (cgroup io accounting, else /proc/PID/io)",
        ("job_id", "tier"),
        "bytes",
        "jobs",
        "job_io",
    ),
    # Object-storage tiers (issue 16): requests the job's processes reported (`gpufeed run`'s
    # botocore patch, the SDK's Job.add_io); `operation`: read, write, metadata; `reason`:
    # throttled (HTTP 503 SlowDown, 429), failed (any other error or no answer).
    _object(
        "gpufeed_job_object_storage_requests_total",
        "Object-storage requests the job made per tier and operation, failed ones included",
        ("job_id", "tier", "operation"),
        "",
        "jobs",
    ),
    _object(
        "gpufeed_job_object_storage_request_seconds_total",
        "Time the job's object-storage requests took, request sent to response headers "
        "(rate over the requests' rate: mean request latency)",
        ("job_id", "tier", "operation"),
        "seconds",
        "jobs",
    ),
    _object(
        "gpufeed_job_object_storage_errors_total",
        "The job's object-storage requests that failed: throttled (HTTP 503 SlowDown, 429) "
        "or failed (any other error status, or no answer)",
        ("job_id", "tier", "operation", "reason"),
        "",
        "jobs",
    ),
    MetricSpec(
        "gpufeed_job_cache_requested_read_bytes_total",
        "counter",
        "Bytes the job's read calls returned, from the page cache or not (/proc/PID/io rchar)",
        ("job_id",),
        "bytes",
        "jobs",
        "job_cache",
    ),
    MetricSpec(
        "gpufeed_job_cache_fetched_read_bytes_total",
        "counter",
        "Bytes storage had to fetch for the job's reads, readahead included (/proc/PID/io "
        "read_bytes); 1 - this / requested is the job's page-cache hit ratio",
        ("job_id",),
        "bytes",
        "jobs",
        "job_cache",
    ),
    MetricSpec(
        "gpufeed_job_cache_open_file_bytes",
        "gauge",
        "Size of the regular files the job has open on a block-backed tier",
        ("job_id", "tier"),
        "bytes",
        "jobs",
        "job_cache",
    ),
    MetricSpec(
        "gpufeed_job_cache_resident_bytes",
        "gauge",
        "Bytes of the job's open files on the tier that are in the page cache (cachestat(2))",
        ("job_id", "tier"),
        "bytes",
        "jobs",
        "job_cache",
    ),
    MetricSpec(
        "gpufeed_job_cache_evicted_bytes",
        "gauge",
        "Bytes of the job's open files on the tier that memory reclaim evicted from the page "
        "cache (cachestat(2) nr_evicted; dropped or truncated pages do not count)",
        ("job_id", "tier"),
        "bytes",
        "jobs",
        "job_cache",
    ),
    MetricSpec(
        "gpufeed_job_cache_recently_evicted_bytes",
        "gauge",
        "Of the evicted bytes, those the kernel counts as still in the working set (cachestat(2) "
        "nr_recently_evicted: a re-read would activate them); streaming reads have none",
        ("job_id", "tier"),
        "bytes",
        "jobs",
        "job_cache",
    ),
    MetricSpec(
        "gpufeed_job_cpu_usage_seconds_total",
        "counter",
        "CPU time the job's cgroup used (cgroup cpu.stat usage_usec, v1 cpuacct.usage)",
        ("job_id",),
        "seconds",
        "jobs",
        "job_cpu",
    ),
    MetricSpec(
        "gpufeed_job_cpu_periods_total",
        "counter",
        "CPU quota periods of the job's cgroup (cpu.stat nr_periods); absent without a quota",
        ("job_id",),
        "",
        "jobs",
        "job_cpu",
    ),
    MetricSpec(
        "gpufeed_job_cpu_throttled_periods_total",
        "counter",
        "CPU quota periods in which the job's cgroup was throttled (cpu.stat nr_throttled)",
        ("job_id",),
        "",
        "jobs",
        "job_cpu",
    ),
    MetricSpec(
        "gpufeed_job_cpu_throttled_seconds_total",
        "counter",
        "Time the job's cgroup was throttled by its CPU quota (cpu.stat throttled time)",
        ("job_id",),
        "seconds",
        "jobs",
        "job_cpu",
    ),
    MetricSpec(
        "gpufeed_job_cpu_waiting_seconds_total",
        "counter",
        "Time the job's threads were runnable but waited for a CPU, summed over its threads "
        "(schedstat run-queue wait)",
        ("job_id",),
        "seconds",
        "jobs",
        "job_cpu",
    ),
    MetricSpec(
        "gpufeed_job_cpu_running_seconds_total",
        "counter",
        "Time the job's threads ran on a CPU, summed over its threads (schedstat): what "
        "their run-queue wait is a share of",
        ("job_id",),
        "seconds",
        "jobs",
        "job_cpu",
    ),
    MetricSpec(
        "gpufeed_job_cpu_pressure_waiting_seconds_total",
        "counter",
        "Time in which at least one of the job's tasks waited for a CPU (cgroup v2 "
        "cpu.pressure some total); absent on cgroup v1",
        ("job_id",),
        "seconds",
        "jobs",
        "job_cpu",
    ),
    MetricSpec(
        "gpufeed_sdk_messages_received_total",
        "counter",
        "SDK datagrams the agent received (accepted or not)",
        (),
        "",
        "jobs",
        "sdk",
        contract=False,
    ),
    MetricSpec(
        "gpufeed_sdk_messages_dropped_total",
        "counter",
        "SDK datagrams the agent dropped, by reason",
        ("reason",),
        "",
        "jobs",
        "sdk",
        contract=False,
    ),
    # Correlator
    MetricSpec(
        "gpufeed_gpu_underutilized_seconds_total",
        "counter",
        "Seconds of GPU underutilization attributed to each cause.",
        (*GPU, "job_id", "cause"),
        "seconds",
        "correlator",
        "correlator",
    ),
    MetricSpec(
        "gpufeed_gpu_underutilization_cause",
        "gauge",
        "1 while an underutilization window is open, with its cause; a data_loading window "
        "also says where its wait is (data_source: storage, or input_pipeline: the job's own "
        "loader, which no node signal explains).",
        (*GPU, "job_id", "cause", "data_source"),
        "",
        "correlator",
        "correlator",
        optional_labels=("data_source",),  # data_loading windows only
    ),
    MetricSpec(
        "gpufeed_gpu_underutilization_windows_total",
        "counter",
        "Closed underutilization windows per cause.",
        (*GPU, "job_id", "cause"),
        "",
        "correlator",
        "correlator",
    ),
    # The windows log's health (correlator/outputs/loghealth.py)
    MetricSpec(
        "gpufeed_windows_log_write_errors_total",
        "counter",
        "Failed attempts to write the windows log or its open-windows record (disk full, I/O).",
        (),
        "",
        "correlator",
        "correlator",
        contract=False,
    ),
    MetricSpec(
        "gpufeed_windows_log_pending_windows",
        "gauge",
        "Closed windows kept in memory until the windows log takes them.",
        (),
        "",
        "correlator",
        "correlator",
        contract=False,
    ),
    MetricSpec(
        "gpufeed_windows_log_dropped_windows_total",
        "counter",
        "Closed windows given up because too many were waiting for the disk.",
        (),
        "",
        "correlator",
        "correlator",
        contract=False,
    ),
    MetricSpec(
        "gpufeed_windows_log_skipped_lines_total",
        "counter",
        "Lines of the windows log skipped when the agent started, by reason.",
        ("reason",),
        "",
        "correlator",
        "correlator",
        contract=False,
    ),
    # The fleet service (gpufeed fleet: fleet/metrics.py)
    _fleet(
        "gpufeed_fleet_job_culprit_info",
        "gauge",
        "1 for a job held back by a straggler at the end of the last cycle's slice: the "
        "culprit (instance, GPU, rank where known) and its own cause.",
        ("job_id", "culprit_instance", "culprit_gpu", "culprit_rank", "cause"),
        "",
        optional=("culprit_gpu", "culprit_rank"),
    ),
    _fleet(
        "gpufeed_fleet_job_imbalance_info",
        "gauge",
        "1 for a job whose GPUs wait for its own imbalance at the end of the last cycle's "
        "slice, no worker at fault: reason stage_imbalance (a pipeline stage slower on every "
        "replica; pipeline_stage says which) or input_imbalance (the slowest data-parallel "
        "rank changes every step).",
        ("job_id", "reason", "pipeline_stage"),
        "",
        optional=("pipeline_stage",),
    ),
    _fleet(
        "gpufeed_fleet_job_waiting_gpus",
        "gauge",
        "GPUs of a held-back job that wait for its culprit (the victims), at the end of the "
        "last cycle's slice.",
        ("job_id",),
        "",
    ),
    _fleet(
        "gpufeed_fleet_job_underutilized_gpus",
        "gauge",
        "GPUs of a job inside an underutilization window at the end of the last cycle's "
        "slice, by the window's cause.",
        ("job_id", "cause"),
        "",
    ),
    _fleet(
        "gpufeed_fleet_job_allocated_gpu_seconds_total",
        "counter",
        "GPU-seconds allocated to the job (gpufeed_job_info present), cycle by cycle.",
        ("job_id",),
        "seconds",
    ),
    _fleet(
        "gpufeed_fleet_job_gpu_seconds_total",
        "counter",
        "The job's allocated GPU-seconds by state: productive, or the cause that held the GPU "
        "back (straggler time also names the culprit's cause); the states sum to the "
        "allocation.",
        ("job_id", "state", "culprit_cause"),
        "seconds",
        optional=("culprit_cause",),
    ),
    _fleet(
        "gpufeed_fleet_job_cost_total",
        "counter",
        "gpufeed_fleet_job_gpu_seconds_total priced at the configured price per GPU-hour, in "
        "the configured currency (absent without a price).",
        ("job_id", "state", "culprit_cause", "currency"),
        "",
        optional=("culprit_cause",),
    ),
    _fleet(
        "gpufeed_fleet_jobs",
        "gauge",
        "Jobs holding GPUs in the last cycle's slice.",
        (),
        "",
    ),
    _fleet(
        "gpufeed_fleet_lag_seconds",
        "gauge",
        "How far the evaluated cycles are behind the newest cycle that is due (0 when caught "
        "up; grows while the TSDB is slow or down).",
        (),
        "seconds",
    ),
    _fleet(
        "gpufeed_fleet_cursor_timestamp_seconds",
        "gauge",
        "Boundary (unix time) of the last completed cycle: everything up to its slice is in "
        "the windows log and the ledger.",
        (),
        "seconds",
    ),
    _fleet(
        "gpufeed_fleet_cycles_total",
        "counter",
        "Cycles attempted, by result (ok, error: the TSDB failed or was unreachable).",
        ("result",),
        "",
        contract=False,
    ),
    _fleet(
        "gpufeed_fleet_cycle_duration_seconds",
        "gauge",
        "Wall time of the last completed cycle (queries and analysis).",
        (),
        "seconds",
        contract=False,
    ),
    _fleet(
        "gpufeed_fleet_cycle_queries",
        "gauge",
        "HTTP queries the last completed cycle sent to the TSDB.",
        (),
        "",
        contract=False,
    ),
    _fleet(
        "gpufeed_fleet_cycle_points",
        "gauge",
        "Points (series x steps) the last completed cycle read from the TSDB.",
        (),
        "",
        contract=False,
    ),
    _fleet(
        "gpufeed_fleet_windows_total",
        "counter",
        "Closed windows the fleet wrote to its windows log.",
        (),
        "",
        contract=False,
    ),
    # The cluster's scheduler (gpufeed scheduler: scheduler/collector.py), one per cluster
    _sched(
        "gpufeed_scheduler_up",
        "gauge",
        "1 when the last read of the scheduler worked, 0 when it failed (its series are then "
        "left out).",
        ("scheduler",),
        "",
    ),
    _sched(
        "gpufeed_scheduler_pending_jobs",
        "gauge",
        "Pending jobs (Slurm) or pods (Kubernetes) that ask for GPUs, by queue (partition or "
        "namespace) and the scheduler's pending reason.",
        ("queue", "reason"),
        "",
    ),
    _sched(
        "gpufeed_scheduler_pending_gpus",
        "gauge",
        "GPUs asked for by the pending GPU jobs, by queue.",
        ("queue",),
        "",
    ),
    _sched(
        "gpufeed_scheduler_pending_oldest_wait_seconds",
        "gauge",
        "How long the longest-waiting pending GPU job has waited (since eligible in Slurm, "
        "since created in Kubernetes), by queue.",
        ("queue",),
        "seconds",
    ),
    _sched(
        "gpufeed_scheduler_pending_wait_seconds",
        "histogram",
        "How long the pending GPU jobs have waited so far, at the last read, by queue.",
        ("queue",),
        "seconds",
    ),
    _sched(
        "gpufeed_scheduler_gpus",
        "gauge",
        "The cluster's GPUs as the scheduler sees them: free (on nodes that take jobs), "
        "allocated, or unavailable (free but on nodes down, drained or cordoned).",
        ("state",),
        "",
    ),
    _sched(
        "gpufeed_scheduler_node_free_gpus_max",
        "gauge",
        "The most free GPUs on any one node that takes jobs.",
        (),
        "",
    ),
    _sched(
        "gpufeed_scheduler_backlog_idle_gpus",
        "gauge",
        "Free GPUs while eligible GPU jobs pend, by reason: fragmentation (enough in total, "
        "not enough on the nodes a job needs) or stall (a pending job would fit); absent "
        "otherwise.",
        ("reason",),
        "",
    ),
    _sched(
        "gpufeed_scheduler_cycle_seconds",
        "gauge",
        "The scheduler's last scheduling cycle (Slurm sdiag), main or backfill.",
        ("cycle",),
        "seconds",
    ),
    _sched(
        "gpufeed_scheduler_cycle_mean_seconds",
        "gauge",
        "The scheduler's mean scheduling cycle since its statistics were reset (Slurm sdiag).",
        ("cycle",),
        "seconds",
    ),
    # The agent's own health
    MetricSpec(
        "gpufeed_collector_success",
        "gauge",
        "1 if the collector answered in time on the last sample, else 0.",
        ("collector",),
        "",
        "agent",
        "sampler",
        contract=False,
    ),
    MetricSpec(
        "gpufeed_collector_duration_seconds",
        "gauge",
        "Time the collector took on the last sample (the time bound if it timed out).",
        ("collector",),
        "seconds",
        "agent",
        "sampler",
        contract=False,
    ),
    MetricSpec(
        # /metrics serves the last snapshot at any age; this is how a stalled sampler shows.
        "gpufeed_snapshot_timestamp_seconds",
        "gauge",
        "Unix time at which the sampler took the snapshot this page shows.",
        (),
        "seconds",
        "agent",
        "sampler",
        contract=False,
    ),
    MetricSpec(
        "gpufeed_build_info",
        "gauge",
        "gpufeed version and Python version; always 1.",
        ("version", "python_version"),
        "",
        "agent",
        "sampler",
        contract=False,
    ),
)

BY_NAME: Mapping[str, MetricSpec] = MappingProxyType({m.name: m for m in CATALOGUE})


def spec(name: str) -> MetricSpec:
    """The catalogue entry of `name`; a KeyError names the file to add it to."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(
            f"{name} is not in the metric catalogue (exporter/gpufeed/catalogue.py)"
        ) from None


def sample_names(m: MetricSpec) -> tuple[str, ...]:
    """The series names a family's samples may have in the exposition."""
    if m.type == "histogram":
        return (f"{m.name}_bucket", f"{m.name}_sum", f"{m.name}_count")
    return (m.name,)
