"""Explicit per-stage orders in a strategy file (h2.core.stage_orders) and stages naming their site
(h2.core.links): what runs, and the one-line errors for bad orders and unknown sites."""

import pytest

from h2.core.cluster import load_cluster
from h2.core.errors import UserError
from h2.core.links import Location, rank_locations
from h2.core.schedule import one_f_one_b, one_f_one_b_split_backward
from h2.core.stage_orders import orders_of, run_schedule
from h2.core.strategy import load_strategy, strategy_from_mapping

ALL_FORWARDS_FIRST = ["F0 F1 F2 F3 B0 B1 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"]


def strategy(orders=None, schedule="jeeves", sites=(None, None)):
    data = {
        "dp": 1, "micro_batches": 4, "micro_batch_size": 1, "model": "tiny", "schedule": schedule,
        "stages": [{"chip": chip, "tp": 1, "layers": 2} | ({"site": site} if site else {})
                   for chip, site in zip(("A", "B"), sites)]
    }
    if orders is not None:
        data["orders"] = orders
    return strategy_from_mapping(data, "s.yaml")


def test_a_strategys_orders_are_what_its_stages_run_with_communication_around_each_compute():
    schedule = run_schedule(strategy(ALL_FORWARDS_FIRST))
    assert [str(a) for a in schedule[0][:4]] == ["F0", "SEND_F0", "F1", "SEND_F1"]
    assert [a.kind for a in schedule[1][:4]] == ["RECV_F", "F", "RECV_B", "B"][:2] + ["B", "SEND_B"]
    assert orders_of(schedule) == ALL_FORWARDS_FIRST


@pytest.mark.parametrize("built_in", [one_f_one_b, one_f_one_b_split_backward])
def test_the_orders_of_a_built_in_schedule_run_as_the_same_action_lists(built_in):
    schedule = built_in(2, 4)
    assert run_schedule(strategy(orders_of(schedule), schedule="1f1b")) == schedule


def test_a_schedule_override_other_than_the_strategys_own_runs_the_built_in_schedule():
    assert run_schedule(strategy(ALL_FORWARDS_FIRST), "1f1b") == one_f_one_b(2, 4)


def test_jeeves_without_orders_and_without_a_cluster_is_a_one_line_error():
    with pytest.raises(UserError, match=r"s.yaml: schedule 'jeeves' is generated from the cluster's costs"):
        run_schedule(strategy(), source="s.yaml")


@pytest.mark.parametrize("orders, message", [
    (["F0 F1 F2 F3 B0 B1 B2 B3"], r"field 'orders' must list one order per stage \(2\), got 1"),
    (["F0 F1 F2 F3 B0 B1 B2 X3", ALL_FORWARDS_FIRST[1]], r"orders\[0\]': 'X3' is not an action"),
    (["F0 F1 F2 F3 B0 B1 B2 B3 F4", ALL_FORWARDS_FIRST[1]], r"'F4': micro-batch 4 does not exist"),
    (["F0 F1 F2 F3 B0 B1 B2", ALL_FORWARDS_FIRST[1]], r"orders\[0\]': 'B3' is missing"),
    (["F0 F1 F2 F3 B0 B1 B2 B2", ALL_FORWARDS_FIRST[1]], r"'B2' is listed twice"),
    ([ALL_FORWARDS_FIRST[0], "B0 F0 F1 B1 F2 B2 F3 B3"], r"orders\[1\]': 'B0' comes before 'F0'"),
    (["F0 B0 F1 F2 F3 B1 B2 B3", "F1 F0 B0 B1 F2 B2 F3 B3"], r"the orders deadlock: stage 0 waits before B0"),
    ("F0 B0", r"field 'orders': expected a list"),
])
def test_a_bad_order_is_one_line_naming_file_field_and_action(orders, message):
    with pytest.raises(UserError, match=message) as error:
        strategy(orders)
    assert "s.yaml" in str(error.value) and "\n" not in str(error.value)


# ---- sites ---------------------------------------------------------------------------------------
CLUSTER = (
    "chips:\n"
    "  - {name: A, count: 4, memory_gb: 1, chips_per_node: 4, tp_max: 1, intra_node_gbps: 10, inter_node_gbps: 1, "
    "site: north}\n"
    "  - {name: B, count: 4, memory_gb: 1, chips_per_node: 4, tp_max: 1, intra_node_gbps: 10, inter_node_gbps: 1, "
    "site: south}\n"
    "links:\n"
    "  inter_site: {bandwidth_gbps: 0.1, latency_us: 20000}\n")


@pytest.fixture
def cluster(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER)
    return load_cluster(path)


def test_a_stage_sits_in_its_chip_types_site(cluster):
    assert rank_locations(strategy(ALL_FORWARDS_FIRST),
                          cluster) == [Location("A", 0, "north"), Location("B", 0, "south")]


def test_a_stage_naming_a_site_sits_there_on_a_fresh_node(cluster):
    locations = rank_locations(strategy(ALL_FORWARDS_FIRST, sites=(None, "north")), cluster)
    assert locations == [Location("A", 0, "north"), Location("B", 0, "north")]


def test_a_stage_naming_an_unknown_site_is_a_one_line_error(cluster):
    with pytest.raises(
            UserError, match=r"s.yaml: field 'stages\[1\].site': unknown site 'east' "
            r"\(cluster .*c.yaml names: north, south\)"):
        rank_locations(strategy(ALL_FORWARDS_FIRST, sites=(None, "east")), cluster, "s.yaml")


def test_a_strategy_with_sites_orders_and_an_in_flight_limit_saves_and_loads_unchanged(tmp_path):
    original = strategy(ALL_FORWARDS_FIRST, sites=("north", None))
    original.in_flight_limit = 2
    original.save(tmp_path / "s.yaml")
    assert load_strategy(tmp_path / "s.yaml") == original


ONE_TYPE = (
    "sites: [north, south]\n"
    "chips:\n"
    "  - {name: A, count: 4, memory_gb: 1, chips_per_node: 4, tp_max: 1, intra_node_gbps: 10, inter_node_gbps: 1, "
    "site: north}\n"
    "  - {name: B, count: 4, memory_gb: 1, chips_per_node: 4, tp_max: 1, intra_node_gbps: 10, inter_node_gbps: 1}\n")


def test_a_stage_may_name_a_site_the_clusters_sites_list_names(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(ONE_TYPE)
    locations = rank_locations(strategy(ALL_FORWARDS_FIRST, sites=(None, "south")), load_cluster(path))
    assert locations == [Location("A", 0, "north"), Location("B", 0, "south")]


def test_a_sites_list_naming_a_site_twice_is_a_one_line_error(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(ONE_TYPE.replace("[north, south]", "[north, north]"))
    with pytest.raises(UserError, match=r"c.yaml: field 'sites' must list distinct site names"):
        load_cluster(path)
