"""`gpufeed fleet` and `gpufeed analyze --prometheus` against real servers that require what
the access flags give: Debian's Prometheus behind `--web.config.file` (TLS with our own CA,
basic auth with a bcrypt hash), VictoriaMetrics with `-httpAuth.*`, and a tenant gateway
routing by `X-Scope-OrgID` (Debian's nginx, configured as the gateways in front of Mimir
and Cortex are: a tenant's queries go to its store, a request without a known tenant is
refused with 401). The fleet's windows from Prometheus are the offline analysis's (the
parity test so far ran on VictoriaMetrics only); wrong credentials give one clear line,
lose no window, and the service catches up once they are right."""

from __future__ import annotations

import base64
import math
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import bcrypt
import pytest

from correlator_helpers import analyze_text, scenarios
from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.feeds.access import build_server_url
from gpufeed.correlator.outputs.output import render
from gpufeed.correlator.outputs.windowlog import read_log
from gpufeed.fleet.service import FleetService, FleetSettings
from gpufeed.fleet.timing import CycleTiming
from host_needs import missing
from procports import stop, wait_ready
from prometheus_trace import prometheus_serving, run_analyze
from tls_helpers import make_pki
from tsdb_vm import RestartableVictoria, shift_trace
from victoria import import_trace
from window_match import assert_same_windows

MINUTES = 30
STEP = 5.0
INTERVAL = 300.0  # few cycles: the test is about access, test_fleet.py about cycles
LOOKBACK = 3600.0  # longer than the trace: every cycle sees it from its start
USER, PASSWORD = "gpufeed", "s3cret-pass"


def _trace(ago_minutes: float) -> tuple[str, float, float]:
    """A node's trace ending `ago_minutes` ago, on the minute grid: (text, first, last)."""
    raw, _ = scenarios.single("data_loading", "contended", seed=4, minutes=MINUTES)
    first = 1_760_000_005.0
    offset = math.floor((time.time() - ago_minutes * 60 - MINUTES * 60 - first) / 60) * 60
    return shift_trace(raw, offset), first + offset, first + offset + MINUTES * 60


def _key(w: Window) -> tuple[object, ...]:
    return (w.instance, w.gpu, w.job_id, w.start_seconds, w.end_seconds, w.cause.value)


def _offline(trace: str, end: float, tmp: Path) -> list[dict[str, object]]:
    """The offline analysis of the trace: the windows that closed before its data ended."""
    got = [w for w in analyze_text(trace, tmp) if w.end_seconds < end - 60]
    assert got, "the trace has no closed windows: the test would prove nothing"
    return [w.to_json() for w in sorted(got, key=_key)]


def _assert_file_windows(trace: str, out: Path, tmp: Path) -> None:
    """`out`, analysed from VictoriaMetrics, holds the trace file's windows (to the TSDB's
    precision: tests/window_match.py), in any order."""

    def lines(text: str) -> str:
        return "\n".join(sorted(text.splitlines()))

    assert_same_windows(lines(render(analyze_text(trace, tmp), "jsonl")), lines(out.read_text()))


def _timing() -> CycleTiming:
    return CycleTiming(INTERVAL, LOOKBACK, STEP, 0.0, WindowParams().merge_gap_seconds)


@pytest.fixture(scope="module")
def secured_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ...]]:
    """(url, CA file, trace, first, last): a Prometheus that answers only over TLS (our own
    CA) and only to USER with PASSWORD, serving the trace."""
    tmp = tmp_path_factory.mktemp("prom")
    pki = make_pki(tmp / "pki")
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    web = tmp / "web.yml"
    web.write_text(
        f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
        f"basic_auth_users:\n  {USER}: '{hashed}'\n"
    )
    trace, first, last = _trace(ago_minutes=10)
    path = tmp / "trace.om"
    path.write_text(trace)
    with prometheus_serving(path, tmp, web) as url:
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        auth = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        deadline = time.monotonic() + 60
        while True:  # ready once it answers the right credentials
            req = urllib.request.Request(url + "/-/ready", headers={"Authorization": auth})
            try:
                with urllib.request.urlopen(req, timeout=2, context=ctx) as r:
                    if r.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield url, str(pki.ca), trace, str(first), str(last)


def _fleet(
    url: str, ca: str, password_file: Path, log: Path, start: float, until: float
) -> list[str]:
    argv = [
        sys.executable, "-m", "gpufeed", "fleet", f"--prometheus.url={url}",
        f"--prometheus.user={USER}", f"--prometheus.password-file={password_file}",
        f"--prometheus.ca-file={ca}",
        f"--fleet.interval={INTERVAL:g}", f"--fleet.lookback={LOOKBACK:g}",
        f"--fleet.step={STEP:g}", "--fleet.settle=0", f"--fleet.start={start:.0f}",
        f"--fleet.until={until:.0f}", f"--fleet.windows-log={log}",
        "--web.listen-address=127.0.0.1:0",
    ]  # fmt: skip
    return argv


def test_fleet_reads_a_prometheus_that_requires_tls_and_basic_auth(
    secured_prometheus: tuple[str, ...], tmp_path: Path
) -> None:
    """Wrong password: one line naming the refusal, no cycle passes, nothing is logged.
    Right password: the backfill catches up and logs exactly the offline windows."""
    url, ca, trace, first_s, last_s = secured_prometheus
    first, last = float(first_s), float(last_s)
    timing = _timing()
    until = timing.due(time.time())
    log = tmp_path / "w.jsonl"
    secret = tmp_path / "password"
    secret.write_text("not-the-password\n")
    err = tmp_path / "fleet.err"
    with err.open("wb") as f:
        proc = subprocess.Popen(_fleet(url, ca, secret, log, first, until), stderr=f)
    try:
        deadline = time.monotonic() + 60
        while "retrying" not in err.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, err.read_text()
            time.sleep(0.2)
        time.sleep(3.5)  # retried after 1 and 2 s: still the one line
        assert proc.poll() is None, "the service outlives refused queries"
    finally:
        stop(proc)
    lines = [x for x in err.read_text().splitlines() if x.strip()]
    assert len(lines) == 1, lines
    assert "HTTP 401" in lines[0] and "--prometheus.password-file" in lines[0], lines[0]
    assert not Path(f"{log}.state.json").exists(), "a cycle passed with wrong credentials"
    assert not log.exists() or log.read_text() == ""
    # the right password: every cycle since --fleet.start, none lost
    secret.write_text(PASSWORD + "\n")
    done = subprocess.run(
        _fleet(url, ca, secret, log, first, until), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "failed" not in done.stderr, done.stderr
    got = [w.to_json() for w in sorted(read_log(str(log)), key=_key)]
    assert got == _offline(trace, last, tmp_path)


def test_analyze_reads_a_prometheus_that_requires_tls_and_basic_auth(
    secured_prometheus: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, ca, trace, first_s, last_s = secured_prometheus
    secret = tmp_path / "password"
    secret.write_text(PASSWORD)
    out = tmp_path / "w.jsonl"
    common = [
        "--prometheus", url, "--start", first_s, "--end", last_s, "--step", f"{STEP:g}",
        f"--prometheus.user={USER}", f"--prometheus.ca-file={ca}", "-o", str(out),
    ]  # fmt: skip
    # no CA: the server's certificate is not trusted (one line, nothing written)
    no_ca = [a for a in common if not a.startswith("--prometheus.ca-file")]
    assert run_analyze(*no_ca, f"--prometheus.password-file={secret}") == 1
    assert "CERTIFICATE_VERIFY_FAILED" in capsys.readouterr().err
    assert not out.exists()
    assert run_analyze(*common, f"--prometheus.password-file={secret}") == 0
    # Prometheus keeps float64: the file's windows byte for byte
    assert sorted(out.read_text().splitlines()) == sorted(
        render(analyze_text(trace, tmp_path), "jsonl").splitlines()
    )


def test_victoriametrics_with_http_auth_refuses_wrong_credentials_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`-httpAuth.*`: `analyze --prometheus` with the right password gives the file's
    windows; a wrong one, one line and nothing written; the fleet's cycle fails the same
    way and its engines are not advanced (the retried cycle gives the whole answer)."""
    trace, first, last = _trace(ago_minutes=5)
    path = tmp_path / "trace.om"
    path.write_text(trace)
    vm = RestartableVictoria(
        tmp_path / "vm", [f"-httpAuth.username={USER}", f"-httpAuth.password={PASSWORD}"]
    )
    vm.start()  # /health answers without credentials: the start needs none
    try:
        # the import API asks for them too
        auth = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        import_trace(vm.url, path, headers={"Authorization": auth})
        good, bad = tmp_path / "good", tmp_path / "bad"
        good.write_text(PASSWORD)
        bad.write_text("wrong")
        out = tmp_path / "w.jsonl"
        common = ["--prometheus", vm.url, "--start", f"{first:.0f}", "--end", f"{last:.0f}"]
        common += ["--step", f"{STEP:g}", f"--prometheus.user={USER}", "-o", str(out)]
        assert run_analyze(*common, f"--prometheus.password-file={bad}") == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "HTTP 401" in err[0], err
        assert not out.exists()
        assert run_analyze(*common, f"--prometheus.password-file={good}") == 0
        _assert_file_windows(trace, out, tmp_path)
        # the fleet service: refused, then with the right credentials, the offline windows
        timing = _timing()
        log = tmp_path / "fleet.jsonl"
        settings = FleetSettings(
            build_server_url(vm.url, basic_auth_user=USER, basic_auth_password_file=str(bad)),
            "",
            timing,
            WindowParams(),
            str(log),
            start_seconds=first,
        )
        svc = FleetService(settings)
        b = timing.first_after(first)
        with pytest.raises(Exception, match="HTTP 401"):
            svc.run_cycle(b)
        assert svc.state.cursor_seconds is None
        svc.close()
        right = build_server_url(vm.url, basic_auth_user=USER, basic_auth_password_file=str(good))
        svc = FleetService(FleetSettings(right, "", timing, WindowParams(), str(log), None, first))
        while b <= timing.due(time.time()):
            svc.run_cycle(b)
            b += INTERVAL
        svc.close()
    finally:
        vm.stop()
    got = [w.to_json() for w in sorted(read_log(str(log)), key=_key)]
    assert_same_windows(_offline(trace, last, tmp_path), got)


@contextmanager
def tenant_gateway(tenants: Mapping[str, str], workdir: Path) -> Iterator[str]:
    """nginx routing each `X-Scope-OrgID` in `tenants` to its base URL, 401 for any other
    request; yields its URL. nginx cannot listen on port 0, so the test binds the ephemeral
    port and hands nginx the socket (nginx takes inherited sockets from $NGINX, as in its
    binary upgrade): no port is guessed."""
    exe = shutil.which("nginx")
    if exe is None:
        missing("nginx is not installed (Debian package nginx-light; make promtool)")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    routes = "".join(
        f"    {name} {url.removeprefix('http://')};\n" for name, url in tenants.items()
    )
    temp = "".join(f"  {k}_temp_path {workdir}/{k};\n" for k in ("client_body", "proxy"))
    temp += "".join(f"  {k}_temp_path {workdir}/{k};\n" for k in ("fastcgi", "uwsgi", "scgi"))
    conf = workdir / "nginx.conf"
    conf.write_text(
        f"daemon off;\nerror_log stderr error;\npid {workdir}/nginx.pid;\nevents {{}}\n"
        f"http {{\n  access_log off;\n{temp}"
        f'  map $http_x_scope_orgid $tenant {{\n    default "";\n{routes}  }}\n'
        f"  server {{\n    listen 127.0.0.1:{port};\n    location / {{\n"
        f'      if ($tenant = "") {{ return 401 "no org id\\n"; }}\n'
        f"      proxy_pass http://$tenant;\n    }}\n  }}\n}}\n"
    )
    fd = sock.fileno()
    proc = subprocess.Popen(
        [exe, "-c", str(conf), "-p", str(workdir)],
        pass_fds=[fd],
        env={**os.environ, "NGINX": f"{fd};"},
        stderr=subprocess.DEVNULL,
    )
    sock.close()  # nginx holds it now
    try:
        url = f"http://127.0.0.1:{port}"
        first = next(iter(tenants.values()))
        wait_ready(first + "/health", proc)  # the store behind it answers
        yield url
    finally:
        stop(proc)


def test_a_tenant_header_selects_the_tenants_data_and_none_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two stores behind a gateway that routes by X-Scope-OrgID: `--prometheus.header
    X-Scope-OrgID=team-a` gives team a's windows (the fleet's cycles and analyze alike),
    team b's header team b's, no header one line (HTTP 401) and nothing written."""
    trace, first, last = _trace(ago_minutes=5)
    other = trace.replace('instance="node-t:9400"', 'instance="node-b:9400"')
    stores = {}
    vms = []
    try:
        for name, text in (("team-a", trace), ("team-b", other)):
            path = tmp_path / f"{name}.om"
            path.write_text(text)
            vm = RestartableVictoria(tmp_path / f"vm-{name}")
            vms.append(vm)
            vm.start()
            import_trace(vm.url, path)
            stores[name] = vm.url
        (tmp_path / "nginx").mkdir()
        with tenant_gateway(stores, tmp_path / "nginx") as url:
            out = tmp_path / "w.jsonl"
            common = ["--prometheus", url, "--start", f"{first:.0f}", "--end", f"{last:.0f}"]
            common += ["--step", f"{STEP:g}", "-o", str(out)]
            assert run_analyze(*common) == 1
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and "HTTP 401" in err[0], err
            assert not out.exists()
            for name, text in (("team-a", trace), ("team-b", other)):
                assert run_analyze(*common, f"--prometheus.header=X-Scope-OrgID={name}") == 0
                _assert_file_windows(text, out, tmp_path)
            # the fleet service with team a's header: team a's windows, none of team b's
            timing = _timing()
            log = tmp_path / "fleet.jsonl"
            tenant = build_server_url(url, ["X-Scope-OrgID=team-a"])
            svc = FleetService(
                FleetSettings(tenant, "", timing, WindowParams(), str(log), None, first)
            )
            b = timing.first_after(first)
            while b <= timing.due(time.time()):
                svc.run_cycle(b)
                b += INTERVAL
            svc.close()
    finally:
        for vm in vms:
            vm.stop()
    got = [w.to_json() for w in sorted(read_log(str(log)), key=_key)]
    assert_same_windows(_offline(trace, last, tmp_path), got)
