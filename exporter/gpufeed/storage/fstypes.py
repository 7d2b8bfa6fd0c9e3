"""Which filesystem types count as storage when no tiers are configured.

Without tiers the collector exports every mount backed by a block device or a network
filesystem. Pseudo filesystems have no device (major 0) and are never exported; the list
below also names them so that the rule is visible. Read-only image filesystems (squashfs,
erofs, iso9660) sit on real loop devices but are packages, not data tiers, so they are
left out too. FUSE filesystems are userspace daemons of every kind; only those known to
front network or object storage count.
"""

from __future__ import annotations

PSEUDO_FSTYPES = frozenset(
    {
        "autofs",
        "binfmt_misc",
        "bpf",
        "cgroup",
        "cgroup2",
        "configfs",
        "debugfs",
        "devpts",
        "devtmpfs",
        "efivarfs",
        "fusectl",
        "hugetlbfs",
        "mqueue",
        "nsfs",
        "overlay",
        "proc",
        "pstore",
        "ramfs",
        "rpc_pipefs",
        "securityfs",
        "selinuxfs",
        "sysfs",
        "tmpfs",
        "tracefs",
        "aufs",
    }
)

IMAGE_FSTYPES = frozenset({"squashfs", "erofs", "iso9660"})

NETWORK_FSTYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "lustre",
        "beegfs",
        "gpfs",
        "glusterfs",
        "wekafs",
    }
)

# FUSE subtypes (fstype "fuse.SUBTYPE") that front network or object storage.
NETWORK_FUSE_SUBTYPES = frozenset(
    {
        "ceph-fuse",
        "glusterfs",
        "sshfs",
        "s3fs",
        "gcsfuse",
        "goofys",
        "rclone",
        "juicefs",
        "mountpoint-s3",
        "blobfuse",
        "blobfuse2",
        "alluxio-fuse",
    }
)


def is_network(fstype: str) -> bool:
    if fstype in NETWORK_FSTYPES:
        return True
    return fstype.startswith("fuse.") and fstype[5:] in NETWORK_FUSE_SUBTYPES


def is_excluded_by_default(fstype: str) -> bool:
    """Never exported without tiers, whatever device it claims."""
    return fstype in PSEUDO_FSTYPES or fstype in IMAGE_FSTYPES
