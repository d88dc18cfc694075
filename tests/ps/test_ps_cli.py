"""`h2 ps` commands refuse bad input with one line and exit status 2."""

import socket

import pytest

from h2.ps.auth import SECRET_ENV, write_run_secrets

GOOD = "mode: dips\nclusters: [{{id: a}}]\nout: {out}\n"


@pytest.fixture
def run_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(GOOD.format(out=tmp_path / "out"))
    return str(path)


@pytest.fixture
def secret_file(tmp_path):
    return write_run_secrets(str(tmp_path / "out" / "secrets"), 2, ["a"])


def test_a_master_on_a_port_in_use_exits_2_with_one_line(cli, run_file, secret_file):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = cli("h2.cli.main", "ps", "master", "--config", run_file, "--port", str(port), "--secret-file",
                     secret_file)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == \
        f"h2: error: master: cannot listen on 127.0.0.1:{port} (port in use or address unavailable)"


@pytest.mark.parametrize("args, message", [
    (["shard", "--master", "nowhere", "--index", "0"], "h2: error: --master: expected HOST:PORT, got 'nowhere'"),
    (["launch", "--config", "{run}", "--kill", "master@soon"
      ], "h2: error: --kill 'master@soon': expected NAME@SECONDS"),
    (["launch", "--config", "{run}", "--resume", "--overwrite"
      ], "h2: error: --resume and --overwrite exclude each other"),
    (["launch", "--config", "{run}", "--resume"], "no run to resume"),
])
def test_bad_ps_command_lines_exit_2_with_one_line(cli, run_file, args, message):
    result = cli("h2.cli.main", "ps", *[arg.format(run=run_file) for arg in args])
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert message in result.stderr


@pytest.mark.parametrize("args, message", [
    (["master", "--config", "{run}"], "h2: error: master needs the run's Di-PS secret: pass --secret-file FILE or set "
     f"{SECRET_ENV}"),
    (["shard", "--master", "127.0.0.1:1", "--index", "0"], "h2: error: shard/0 needs the run's Di-PS secret"),
    (["master", "--config", "{run}", "--secret-file", "{secrets}/shard-0.key"], "holds the credential of shard/0, "
     "not of master"),
    (["shard", "--master", "127.0.0.1:1", "--index", "1", "--secret-file", "{secrets}/shard-0.key"
      ], "holds the credential of shard/0, not of shard/1"),
    (["master", "--config", "{run}", "--secret-file", "{run}"], "not a Di-PS secret file"),
])
def test_a_process_without_its_secret_exits_2_with_one_line(cli, run_file, secret_file, monkeypatch, args, message):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    folder = secret_file.rsplit("/", 1)[0]
    result = cli("h2.cli.main", "ps", *[arg.format(run=run_file, secrets=folder) for arg in args])
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert message in result.stderr


def test_a_secret_readable_by_others_is_refused(cli, run_file, secret_file):
    import os

    os.chmod(secret_file, 0o644)
    result = cli("h2.cli.main", "ps", "master", "--config", run_file, "--secret-file", secret_file)
    assert result.returncode == 2 and "must be readable by its owner only (chmod 600), its mode is 644" in result.stderr


def test_launch_writes_the_run_secret_and_each_participants_key_readable_by_the_owner_only(cli, run_file, tmp_path):
    import os
    import stat

    result = cli("h2.cli.main", "ps", "secrets", "--config", run_file)
    assert result.returncode == 0, result.stderr
    folder = tmp_path / "out" / "secrets"
    assert sorted(os.listdir(folder)) == ["cluster-a.key", "run.secret", "shard-0.key", "shard-1.key"]
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert all(stat.S_IMODE(os.stat(folder / name).st_mode) == 0o600 for name in os.listdir(folder))
    assert "run_secret" not in (folder / "cluster-a.key").read_text()
