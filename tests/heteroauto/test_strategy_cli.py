import json
import os
import shutil

import pytest
import yaml

from autohelpers import CLUSTERS, STRATEGIES
from h2.cli.heteroauto import main
from h2.core.errors import UserError
from h2.core.strategy import load_strategy
from h2.launch import profiling_job
from heteroauto import planning

LOCAL = os.path.join(CLUSTERS, "local-emulated.yaml")
TINY = os.path.join(STRATEGIES, "local-tiny-pp2.yaml")


def test_local_tiny_strategy_loads_and_maps_ranks_in_stage_order():
    strategy = load_strategy(TINY)
    assert [s.chip for s in strategy.stages] == ["emu-big", "emu-small"]
    assert [list(r) for r in strategy.stage_ranks()] == [[0], [1]]


def test_strategy_round_trips(tmp_path):
    strategy = load_strategy(TINY)
    strategy.save(tmp_path / "s.yaml")
    assert load_strategy(tmp_path / "s.yaml") == strategy


@pytest.mark.parametrize("stage, error", [
    pytest.param("{chip: a, tp: 1, layers: 3}", r"s.yaml: field 'stages': layers sum to 3, model 'tiny' has 4",
                 id="layers_must_sum_to_the_model"),
    pytest.param("{chip: a, tp: 3, layers: 4}", r"field 'stages\[0\].tp'", id="tp_must_be_a_power_of_two"),
])
def test_a_bad_strategy_file_is_refused_with_an_error_naming_the_field(write, stage, error):
    path = write("s.yaml", f"dp: 1\nmicro_batches: 2\nmicro_batch_size: 1\nmodel: tiny\nstages: [{stage}]\n")
    with pytest.raises(UserError, match=error):
        load_strategy(path)


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_search_json_on_exp_c1_needs_no_other_flag(capsys):
    code, out, err = run(capsys, "search", "--cluster", os.path.join(CLUSTERS, "exp-c-1.yaml"), "--model", "h2-100b",
                         "--json")
    assert code == 0, err
    result = json.loads(out)
    stages = result["strategy"]["stages"]
    assert sum(s["layers"] for s in stages) == 96
    assert all(s["memory_gb"] <= s["capacity_gb"] for s in stages)
    assert {"iteration_s", "tokens_per_chip_s", "hetero_speedup_ratio", "search_s", "evaluated"} <= set(result)
    assert result["hetero_speedup_ratio"] > 0 and result["evaluated"] > 0


def test_search_writes_a_strategy_that_simulate_reads(capsys, tmp_path):
    out_path = str(tmp_path / "s.yaml")
    code, out, err = run(capsys, "search", "--cluster", LOCAL, "--out", out_path, "--top", "3")
    assert code == 0, err
    assert "predicted iteration" in out and "HeteroSpeedupRatio" in out
    code, out, err = run(capsys, "simulate", "--cluster", LOCAL, "--strategy", out_path, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["iteration_s"] > 0 and len(result["stages"]) == len(load_strategy(out_path).stages)


def test_exhaustive_search_agrees_on_the_local_cluster(capsys):
    _, out, _ = run(capsys, "search", "--cluster", LOCAL, "--json", "--no-baselines")
    _, exhaustive, _ = run(capsys, "search", "--cluster", LOCAL, "--json", "--no-baselines", "--exhaustive")
    assert json.loads(out)["iteration_s"] == pytest.approx(json.loads(exhaustive)["iteration_s"])


def test_baseline_batch_can_be_set_for_the_speedup_ratio(capsys):
    code, out, err = run(capsys, "search", "--cluster", LOCAL, "--json", "--baseline-gbs-tokens", "512")
    assert code == 0, err
    result = json.loads(out)
    assert {b["gbs_tokens"] for b in result["baselines"].values()} == {512}
    assert result["hetero_speedup_ratio"] > 0


def test_gbs_flag_takes_suffixes(capsys):
    code, out, err = run(capsys, "search", "--cluster", LOCAL, "--gbs-tokens", "2K", "--json", "--no-baselines")
    assert code == 0, err
    assert json.loads(out)["gbs_tokens"] == 2048


@pytest.mark.parametrize("argv,message", [
    (["search", "--cluster", "missing.yaml"], "missing.yaml: no such file"),
    (["search", "--cluster", LOCAL, "--gbs-tokens", "12x"], "--gbs-tokens"),
    (["search", "--cluster", LOCAL, "--gbs-tokens", "2K", "--gbs-sequences", "8"
      ], "argument --gbs-sequences: not allowed with argument --gbs-tokens"),
    (["search", "--cluster", LOCAL, "--model", "nope"], "unknown model preset 'nope'"),
    (["search", "--cluster", LOCAL, "--alpha", "2"], "field 'alpha'"),
    (["simulate", "--cluster", LOCAL, "--strategy", TINY, "--profile", "missing.yaml"], "missing.yaml: no such file"),
    (["search"], "--cluster"),
])
def test_user_errors_exit_2_with_one_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert err.startswith("heteroauto: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_strategy_naming_a_chip_the_cluster_lacks_exits_2(capsys, write):
    path = write("s.yaml", open(TINY).read().replace("chip: emu-small", "chip: emu-huge"))
    code, _, err = run(capsys, "simulate", "--cluster", LOCAL, "--strategy", path)
    assert code == 2 and "s.yaml: field 'stages[1].chip': unknown chip type 'emu-huge'" in err


def test_strategy_using_more_chips_than_the_cluster_has_exits_2(capsys, write):
    path = write("s.yaml", open(TINY).read().replace("dp: 1", "dp: 4").replace("micro_batches: 8", "micro_batches: 2"))
    code, _, err = run(capsys, "simulate", "--cluster", LOCAL, "--strategy", path)
    assert code == 2 and "uses 4 chips of type 'emu-big'" in err


def test_simulated_local_strategy_agrees_with_the_cost_model_without_transfers(capsys):
    code, out, err = run(capsys, "simulate", "--cluster", LOCAL, "--strategy", TINY, "--no-transfers", "--json")
    assert code == 0, err
    result = json.loads(out)
    # two stages, the slower (emu-big) first: the replay is at most the closed form the cost model uses
    assert 0 < result["iteration_s"] <= result["cost_model_iteration_s"] * (1 + 1e-12)


def test_fixed_dp_that_no_tp_makes_divide_a_chip_count_exits_2(capsys, write):
    text = open(LOCAL).read().replace("    count: 2\n    memory_gb: 0.004", "    count: 3\n    memory_gb: 0.004")
    path = write("odd.yaml", text)
    code, _, err = run(capsys, "search", "--cluster", path, "--dp", "2")
    assert code == 2
    assert "odd.yaml: field 'chips[0].count': 3 chips of type 'emu-big' are not divisible by tp * dp for dp=2" in err


def test_fixed_dp_must_divide_the_batch(capsys):
    code, _, err = run(capsys, "search", "--cluster", LOCAL, "--dp", "3")
    assert code == 2 and "--dp 3: must divide the global batch of 8 micro-batches" in err


def test_fixed_dp_is_kept(capsys):
    code, out, err = run(capsys, "search", "--cluster", LOCAL, "--dp", "1", "--json", "--no-baselines")
    assert code == 0, err
    assert json.loads(out)["strategy"]["dp"] == 1


def test_malformed_cluster_yaml_exits_2(capsys, write):
    path = write("bad.yaml", "chips: [oops\n")
    code, _, err = run(capsys, "search", "--cluster", path)
    assert code == 2 and "bad.yaml: malformed YAML" in err


def test_model_that_fits_nowhere_exits_2_with_the_tightest_constraint(capsys):
    code, _, err = run(capsys, "search", "--cluster", LOCAL, "--model", "small", "--gbs-sequences", "8", "--seq-len",
                       "256")
    assert code == 2 and "no feasible strategy: memory" in err


def test_profile_synthesise_writes_a_profile_the_search_accepts(capsys, tmp_path):
    path = tmp_path / "p.yaml"
    code, out, err = run(capsys, "profile", "--cluster", LOCAL, "--chip", "emu-big", "--synthesise", "--out", str(path))
    assert code == 0, err
    profile = yaml.safe_load(path.read_text())
    assert (profile["chip"], profile["source"]) == ("emu-big", "synthesised")
    assert [layer["tp"] for layer in profile["layers"]] == [1, 2]

    def searched_iteration_s():
        code, out, err = run(capsys, "search", "--cluster", LOCAL, "--profile", str(path), "--json", "--no-baselines")
        assert code == 0, err
        return json.loads(out)["iteration_s"]

    as_written = searched_iteration_s()
    for layer in profile["layers"]:
        layer["backward_s"] *= 10
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    assert searched_iteration_s() > as_written  # the search plans with the profile's times


def test_profile_of_an_unknown_chip_exits_2(capsys, tmp_path):
    code, _, err = run(capsys, "profile", "--cluster", LOCAL, "--chip", "nope", "--synthesise", "--out",
                       str(tmp_path / "p.yaml"))
    assert code == 2 and "unknown chip type 'nope'" in err


def test_profile_measures_a_decoder_layer_through_torch(capsys, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("h2.model.transformer")
    path = str(tmp_path / "p.yaml")
    code, out, err = run(capsys, "profile", "--force", "--cluster", LOCAL, "--chip", "emu-small", "--device", "cpu",
                         "--out", path, "--repeats", "1")
    assert code == 0, err
    from heteroauto.profiles import load_profile
    profile = load_profile(path)
    assert profile.source == "measured" and profile.layer(1).forward_s > 0 and profile.layer(1).activation_bytes > 0
    code, out, err = run(capsys, "search", "--cluster", LOCAL, "--profile", path, "--json", "--no-baselines")
    assert code == 0, err


FIG8_100B = """dp: 4
micro_batches: 64
micro_batch_size: 1
seq_len: 4096
model: h2-100b
stages:
  - {chip: A, tp: 4, layers: 40, recompute: true}
  - {chip: A, tp: 8, layers: 32%s}
  - {chip: B, tp: 8, layers: 24%s}
"""


def simulate_json(capsys, path):
    code, out, err = run(capsys, "simulate", "--cluster", os.path.join(CLUSTERS, "exp-a-1.yaml"), "--strategy", path,
                         "--json")
    assert code == 0, err
    result = json.loads(out)
    del result["simulate_s"]  # wall time of the replay
    return result


def test_per_stage_dp_round_trips_and_a_stage_dp_equal_to_the_strategy_dp_changes_nothing(capsys, write):
    uniform = write("uniform.yaml", FIG8_100B % ("", ""))
    explicit = write("explicit.yaml", FIG8_100B % (", dp: 4", ", dp: 4"))
    assert simulate_json(capsys, uniform) == simulate_json(capsys, explicit)
    strategy = load_strategy(write("fig8.yaml", FIG8_100B % (", dp: 2", ", dp: 2")))
    assert [strategy.stage_dp(i) for i in range(3)] == [4, 2, 2]
    strategy.save(write("saved.yaml", ""))
    assert load_strategy(os.path.join(os.path.dirname(uniform), "saved.yaml")) == strategy


def test_a_stage_with_half_the_replicas_does_twice_the_work_per_micro_batch_on_half_the_chips(capsys, write):
    uniform = simulate_json(capsys, write("uniform.yaml", FIG8_100B % ("", "")))
    halved = simulate_json(capsys, write("fig8.yaml", FIG8_100B % (", dp: 2", ", dp: 2")))
    assert [s["dp"] for s in halved["stages"]] == [4, 2, 2]
    for before, after in zip(uniform["stages"][1:], halved["stages"][1:]):
        assert after["busy_s"] == pytest.approx(2 * before["busy_s"])
        assert after["memory_gb"] > before["memory_gb"]
    assert halved["stages"][0]["busy_s"] == pytest.approx(uniform["stages"][0]["busy_s"])

    def tokens_per_chip_per_iteration(result):
        return result["tokens_per_chip_s"] * result["iteration_s"]

    assert tokens_per_chip_per_iteration(uniform) / tokens_per_chip_per_iteration(halved) == pytest.approx(
        (16 + 16 + 16) / (16 + 32 + 32))


def test_paper_cost_model_reproduces_the_documented_exp_a1_speedup_ratio(capsys):
    code, out, err = run(capsys, "search", "--cluster", os.path.join(CLUSTERS, "exp-a-1.yaml"), "--cost-model", "paper",
                         "--baseline-gbs-tokens", "2M", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert (result["search"], round(result["hetero_speedup_ratio"] * 100, 2)) == ("paper", 88.25)  # docs/heteroauto.md


def test_search_reports_a_proved_optimum_and_each_stage_transfer(capsys):
    code, out, err = run(capsys, "search", "--cluster", LOCAL, "--json", "--no-baselines")
    assert code == 0, err
    result = json.loads(out)
    assert result["optimal"] and result["gap"] == 0 and result["cost_model"] == "full"
    assert result["strategy"]["stages"][-1]["send_s"] == 0 < result["strategy"]["stages"][0]["send_s"]


def test_output_marks_emulated_chips(capsys):
    code, out, err = run(capsys, "search", "--cluster", LOCAL, "--no-baselines")
    assert code == 0, err
    assert "emu-big=2 emulated" in out and out.count("(emulated)") >= 2


@pytest.mark.parametrize("flags, message", [
    (["--search", "paper", "--monotone-tp"], "only with --search exact"),
    (["--refine-all-dp"], "only with --search paper"),
])
def test_flags_of_the_other_search_are_refused(capsys, flags, message):
    code, _, err = run(capsys, "search", "--cluster", LOCAL, *flags)
    assert code == 2 and message in err


@pytest.mark.parametrize("args, module, work", [(["search", "--out", "/proc/no/such/s.yaml"], planning, "run_search"),
                                                (["profile", "--synthesise", "--out-dir", "/proc/no/such"
                                                  ], profiling_job, "synthesise_profile")])
def test_an_unwritable_output_is_refused_in_one_line_before_any_work(capsys, monkeypatch, args, module, work):

    def work_ran(*_, **__):  # the search, the profiling
        raise AssertionError(f"{work} ran before the unwritable output was refused")

    monkeypatch.setattr(module, work, work_ran)
    code, out, err = run(capsys, args[0], "--cluster", LOCAL, *args[1:])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "cannot create folder '/proc/no" in err


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this host may have CUDA")
def test_profile_on_a_device_this_host_lacks_is_one_line_before_any_rank_starts(cli, tmp_path):
    # The chips of a cluster without `emulation:` are measured on --device; each measuring rank used
    # to fail there, and the CLI printed the ranks' traceback.
    plain = open(LOCAL).read().replace("tp_max: 2", "tp_max: 1")
    plain = "\n".join(line for line in plain.splitlines() if "emulation:" not in line)
    cluster = tmp_path / "plain.yaml"
    cluster.write_text(plain)
    result = cli("h2.cli.heteroauto", "profile", "--cluster", str(cluster), "--chip", "emu-big", "--device", "cuda",
                 "--repeats", "1", "--out-dir", str(tmp_path / "profiles"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == "heteroauto: error: --device cuda: device 'cuda' is not available on this machine"


ZORSE_FLAGS = "--memory-fraction, --ministages, --offload, --max-groups, --min-groups, --lone-group-ministages, " \
              "--no-overlap and --grad-clip"


@pytest.mark.parametrize("flags", [["--memory-fraction", "0.5"], ["--ministages", "2"], ["--offload", "on"],
                                   ["--max-groups", "1"], ["--min-groups", "2"], ["--lone-group-ministages"],
                                   ["--no-overlap"], ["--grad-clip", "0"]])
def test_each_flag_of_the_zorse_group_is_refused_without_planner_zorse(capsys, flags):
    code, out, err = run(capsys, "search", "--cluster", LOCAL, "--no-baselines", *flags)
    assert (code, out) == (2, "")
    assert err.strip() == f"heteroauto: error: {ZORSE_FLAGS}: only with --planner zorse"


@pytest.mark.parametrize("flags", [["--exhaustive"], ["--search", "paper"], ["--dp", "1"]])
def test_the_heteroauto_search_flags_are_refused_with_planner_zorse(capsys, flags):
    code, _, err = run(capsys, "search", "--planner", "zorse", "--cluster", LOCAL, *flags)
    assert code == 2
    assert err.strip() == "heteroauto: error: --exhaustive, --search and --dp: only with --planner heteroauto"


def test_the_zorse_flags_are_one_group_of_the_search_help(capsys):
    with pytest.raises(SystemExit):
        main(["search", "--help"])
    help_text = capsys.readouterr().out
    group = help_text[help_text.index("the Zorse planner (--planner zorse):"):]
    assert all(flag in group for flag in ZORSE_FLAGS.replace(" and", ",").split(", "))
    assert "--exhaustive" not in group


def _speedup(capsys, cluster: str, *flags: str) -> dict:
    code, out, err = run(capsys, "search", "--cluster", os.path.join(CLUSTERS, cluster), "--json", *flags)
    assert code == 0, err
    return json.loads(out)


def test_the_default_speedup_ratio_is_the_papers_every_type_alone_with_the_same_baseline_batch(capsys):
    default = _speedup(capsys, "exp-a-2.yaml")  # 6M tokens; the cluster file's baseline_gbs_tokens: 2M (Table 6)
    assert default["speedup_baseline"] == "paper"
    assert [b["gbs_tokens"] for b in default["baselines"].values()] == [2 << 20] * 3
    constant_gbs = _speedup(capsys, "exp-a-1.yaml")  # 2M tokens over 3 types of 256 chips
    assert [b["gbs_tokens"] for b in constant_gbs["baselines"].values()] == [2 << 20] * 3
    share = _speedup(capsys, "exp-a-1.yaml", "--speedup-baseline", "share")
    assert share["speedup_baseline"] == "share"
    assert [b["gbs_tokens"] for b in share["baselines"].values()] == [170 * 4096] * 3
    assert share["hetero_speedup_ratio"] > constant_gbs["hetero_speedup_ratio"]


def test_the_per_type_share_ratio_is_named_so_and_rounds_an_indivisible_share(capsys):
    code, out, err = run(capsys, "search", "--cluster", os.path.join(CLUSTERS, "exp-c-2.yaml"), "--speedup-baseline",
                         "share")
    assert code == 0, err
    line = next(line for line in out.splitlines() if "HeteroSpeedupRatio" in line)
    assert line.startswith("per-type-share HeteroSpeedupRatio: ") and "n/a" not in line
    assert "rounded from 1489 sequences" in line  # chip B's share of 2048 sequences: 2048 * 1024 / 1408, a prime


def test_a_baseline_batch_with_the_share_ratio_is_one_line(capsys):
    code, out, err = run(capsys, "search", "--cluster", LOCAL, "--speedup-baseline", "share", "--baseline-gbs-tokens",
                         "512")
    assert code == 2 and "--speedup-baseline share takes none" in err
