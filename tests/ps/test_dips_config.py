"""A Di-PS run file is checked field by field; bad input is one line naming the file and the field."""

import pytest

from h2.core.dips import MODE_RULES, SECRET_ENV, PSOptions, load_dips_config
from h2.core.errors import UserError

GOOD = """
mode: dips
inner_steps: 4
penalty: {alpha: 0.02, beta: 3.0}
clusters:
  - {id: a}
  - {id: b, step_time_s: 0.5}
"""


def write(tmp_path, text: str) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return str(path)


def test_a_good_run_file_loads_with_the_papers_defaults(tmp_path):
    config = load_dips_config(write(tmp_path, GOOD))
    assert (config.outer.lr, config.outer.momentum, config.penalty.clip_norm) == (0.7, 0.8, 1.0)
    assert [c.id for c in config.clusters] == ["a", "b"]


@pytest.mark.parametrize("change, message", [
    (("alpha: 0.02", "alpha: 0"), "field 'penalty.alpha' must be in (0, 1], got 0.0"),
    (("alpha: 0.02", "alpha: 1.5"), "field 'penalty.alpha' must be in (0, 1], got 1.5"),
    (("beta: 3.0", "beta: 0"), "field 'penalty.beta' must be positive, got 0.0"),
    (("inner_steps: 4", "inner_steps: 0"), "field 'inner_steps' must be at least 1, got 0"),
    (("{id: b, step_time_s: 0.5}", "{id: a}"), "field 'clusters[1].id': duplicate cluster id 'a'"),
    (("mode: dips", "mode: fast"), "field 'mode': must be one of 'sync', 'async', 'dips', 'async-diloco', got 'fast'"),
    (("mode: dips", "mode: async_diloco"), "field 'mode': must be one of 'sync', 'async', 'dips', 'async-diloco'"),
    (("mode: dips", "mode: dips\nwindow: 3"), "unknown field 'window'"),
    (("inner_steps: 4", "inner_steps: [4"), "malformed YAML"),
    (("inner_steps: 4", "inner_steps: 4\nsync_retry_s: -1"),
     "field 'sync_retry_s' must be 0 (train on at once) or a positive number of seconds, got -1.0"),
    (("inner_steps: 4", "inner_steps: 4\nsync_retry_s: .inf"),
     "field 'sync_retry_s': expected a finite number, got inf"),
])
def test_a_bad_run_file_is_one_line_naming_file_and_field(tmp_path, change, message):
    path = write(tmp_path, GOOD.replace(*change))
    with pytest.raises(UserError) as error:
        load_dips_config(path)
    assert str(error.value).startswith(path) and message in str(error.value)
    assert "\n" not in str(error.value)


def test_async_diloco_is_a_mode_of_its_own_decided_with_the_others(tmp_path):
    config = load_dips_config(write(tmp_path, GOOD.replace("mode: dips", "mode: async-diloco")))
    assert (config.rules.decentralized, config.uses_penalty, config.window_s) == (True, False, config.grace_s)
    assert [MODE_RULES[m].decentralized for m in ("sync", "async", "dips")] == [False, False, False]


@pytest.mark.parametrize("cluster, message", [
    ("{id: b, strategy: pipe.yaml}", "field 'clusters[1].strategy': mode async-diloco runs single-device clusters "
     "only"),
    ("{id: b, outlier: scale}", "field 'clusters[1].outlier': mode async-diloco has no fault injection"),
])
def test_async_diloco_refuses_what_it_cannot_run_in_one_line(tmp_path, cluster, message):
    path = write(tmp_path,
                 GOOD.replace("mode: dips", "mode: async-diloco").replace("{id: b, step_time_s: 0.5}", cluster))
    with pytest.raises(UserError) as error:
        load_dips_config(path)
    assert str(error.value).startswith(path) and message in str(error.value) and "\n" not in str(error.value)


def test_a_bad_training_section_names_the_file_and_the_section(tmp_path):
    with pytest.raises(UserError, match=r"run.yaml: field 'train': training option 'lr' out of range"):
        load_dips_config(write(tmp_path, GOOD + "train: {lr: -1}\n"))


def test_the_master_command_refuses_a_bad_run_file_with_exit_2(tmp_path, cli):
    path = write(tmp_path, GOOD.replace("beta: 3.0", "beta: -1"))
    result = cli("h2.cli.main", "ps", "master", "--config", path)
    assert result.returncode == 2
    assert result.stderr.strip() == f"h2: error: {path}: field 'penalty.beta' must be positive, got -1.0"


@pytest.mark.parametrize("options, message", [
    (dict(ps="localhost"), "--ps: expected HOST:PORT, got 'localhost'"),
    (dict(ps="localhost:1"), "--ps needs --cluster-id"),
    (dict(cluster_id="a"), "--cluster-id, --outlier, --pace-step-s and --ps-secret-file need --ps"),
    (dict(pace_step_s=0.5), "--cluster-id, --outlier, --pace-step-s and --ps-secret-file need --ps"),
    (dict(pace_step_s=-1.0), "--pace-step-s must be 0 or positive"),
])
def test_bad_cluster_options_are_one_line(options, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        PSOptions(**options)


def test_a_cluster_without_its_credential_is_refused_before_training(monkeypatch, cli):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    with pytest.raises(UserError, match="--ps needs this cluster's credential: pass --ps-secret-file FILE or set "
                       f"{SECRET_ENV}"):
        PSOptions(ps="localhost:1", cluster_id="a")
    result = cli("h2.cli.main", "train", "--preset", "tiny", "--steps", "1", "--ps", "127.0.0.1:1", "--cluster-id", "a")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "--ps needs this cluster's credential" in result.stderr
