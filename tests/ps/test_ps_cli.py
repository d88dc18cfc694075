"""`h2 ps` commands refuse bad input with one line and exit status 2."""

import socket

import pytest

GOOD = "mode: dips\nclusters: [{{id: a}}]\nout: {out}\n"


@pytest.fixture
def run_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(GOOD.format(out=tmp_path / "out"))
    return str(path)


def test_a_master_on_a_port_in_use_exits_2_with_one_line(cli, run_file):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = cli("h2.cli.main", "ps", "master", "--config", run_file, "--port", str(port))
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
