"""Transport selection, overrides, the ibverbs probe and its fallback, and option errors."""
import os
import shutil
import subprocess
import tempfile

import pytest

import dicomm
from scenarios import run


def test_the_ibverbs_probe_answers_in_one_line():
    probe = dicomm.probe_ibverbs()
    assert probe["message"].startswith("ibverbs:")
    assert "\n" not in probe["message"]
    if probe["available"]:
        assert probe["compiled"] and probe["device"]


def test_the_ibverbs_probe_agrees_with_pyverbs_where_it_is_installed():
    # scripts/bootstrap.sh installs rdma-core and pyverbs whenever it runs as root: only a
    # non-root setup may lack them.
    missing_is_allowed = os.geteuid() != 0
    system_python = shutil.which("python3", path="/usr/bin")
    check = ("import pyverbs.device as d\n"
             "try:\n    print(len(d.get_device_list()))\n"
             "except Exception:\n    print(0)\n")
    result = subprocess.run([system_python or "/usr/bin/python3", "-c", check], capture_output=True, text=True)
    if result.returncode != 0 and missing_is_allowed:
        pytest.skip("pyverbs (Debian python3-pyverbs) is not installed and this setup is not root")
    assert result.returncode == 0, f"pyverbs is missing although the setup ran as root: {result.stderr.strip()}"
    pyverbs_devices = int(result.stdout.strip().splitlines()[-1])
    probe = dicomm.probe_ibverbs()
    if not probe["compiled"] and missing_is_allowed:
        pytest.skip("ibverbs transport not compiled in this build and this setup is not root")
    assert probe["compiled"], "the ibverbs transport is not compiled although the setup ran as root"
    if pyverbs_devices == 0:
        assert not probe["available"]
        assert "no RDMA device" in probe["message"]
    else:
        assert probe["device"] or "no active port" in probe["message"]


def test_auto_selection_uses_shm_on_one_host():
    listener, dialler = run("echo", transport="auto", token="t")
    assert listener.get("data") == "hello", listener
    assert listener["transport"] == dialler["transport"] == "shm"


def test_across_hosts_without_rdma_auto_falls_back_to_tcp_and_says_why():
    if dicomm.probe_ibverbs()["available"]:
        pytest.skip("an RDMA device is present: auto would pick ibverbs")
    listener, dialler = run("echo", transport="auto", env=lambda rank: {"DICOMM_HOST_ID": f"host-{rank}"}, token="t")
    assert listener.get("data") == "hello", listener
    assert listener["transport"] == dialler["transport"] == "tcp"
    assert any("uses tcp" in note and "ibverbs:" in note for note in dialler["notes"])


def test_forcing_ibverbs_without_a_device_fails_with_one_line():
    if dicomm.probe_ibverbs()["available"]:
        pytest.skip("an RDMA device is present")
    store = dicomm.FileStore(tempfile.mkdtemp())
    store.set("dicomm/peer/0", "rank=0\naddress=127.0.0.1\nport=9\nhost_id=elsewhere\npid=1\nibverbs=1\n"
              "ibverbs_device=mlx5_0\n")
    with pytest.raises(dicomm.CommError, match="no active RDMA device") as error:
        dicomm.Endpoint(store, 1, 2, transport="ibverbs", token="t", connect_timeout=5)
    assert "\n" not in str(error.value)


def test_an_unknown_transport_name_is_refused_naming_the_value(monkeypatch):
    monkeypatch.setenv("DICOMM_TRANSPORT", "carrier-pigeon")
    with pytest.raises(ValueError, match="carrier-pigeon"):
        dicomm.Endpoint(dicomm.FileStore(tempfile.mkdtemp()), 0, 1)


def test_a_malformed_environment_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("DICOMM_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="DICOMM_TIMEOUT_S"):
        dicomm.Endpoint(dicomm.FileStore(tempfile.mkdtemp()), 0, 1)


def test_the_api_argument_overrides_the_environment():
    tcp_by_environment = {"DICOMM_TRANSPORT": "tcp"}
    listener, dialler = run("echo", transport="auto", env=tcp_by_environment, token="t")
    assert listener["transport"] == dialler["transport"] == "tcp", "on one host only the environment selects tcp"
    listener, dialler = run("echo", transport="shm", env=tcp_by_environment, token="t")
    assert listener.get("data") == "hello", listener
    assert listener["transport"] == dialler["transport"] == "shm"


def test_sending_to_oneself_or_outside_the_world_is_refused():
    with dicomm.Endpoint(dicomm.FileStore(tempfile.mkdtemp()), 0, 1) as endpoint:
        with pytest.raises(ValueError, match="not another rank"):
            endpoint.isend(b"x", 0)
        with pytest.raises(ValueError, match="not another rank"):
            endpoint.irecv(bytearray(1), 5)
