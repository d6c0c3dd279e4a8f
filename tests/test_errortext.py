"""The one error-text table and its matcher: read by `ask`, the crash rule and the cross-rank rules.

The table is checked row by row (every row's sample matches it, its key is in every match), the
matcher API on its own, and the agreement that is the point of one table: a text `ask` recognises
as a finding's error is the finding the crash rule (or the cross-rank rules) raise for it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchdoctor.catalog import lookup
from torchdoctor.distributed import failtext
from torchdoctor.errortext import match
from torchdoctor.errortext.numbers import EXTRACTORS, extract
from torchdoctor.errortext.table import BY_ID, KNOWN, RULE_ROWS, TABLE
from torchdoctor.evidence import Evidence
from torchdoctor.rules.crash import CRASH_CODES, classify, crash, oom_details
from torchdoctor.triage.logscan import scan
from torchdoctor.triage.matcher import triage

REAL = Path(__file__).parent / "fixtures" / "ask" / "real_errors.jsonl"
GROUPS = {"crash-route", "weights-only", "collective-mismatch", "peer-gone", "collective-timeout",
          "collective-transport"}
CROSS_RANK = {"collective-mismatch": failtext.MISMATCH, "collective-hang": failtext.TIMEOUT}


def _crash_result(msg: str, typ: str = "RuntimeError") -> dict:
    return {"outcome": "crash", "exit_code": 1, "steps": 2, "exception": {
        "type": typ, "message": msg, "traceback": [["/x/train.py", 9, "<module>", True]],
        "user_frame": {"file": "/x/train.py", "line": 9, "function": "<module>", "code": "step()"}}}


def _crash_finding(msg: str):
    (f,) = crash(Evidence(result=_crash_result(msg)))
    return f


# ----------------------------------------------------------------------------- the table
def test_one_table_holds_the_ask_rows_then_the_rules_rows():
    assert TABLE[: len(KNOWN)] == KNOWN and set(TABLE) == set(KNOWN) | set(RULE_ROWS)
    assert len(BY_ID) == len(TABLE)
    assert all(not k.ask for k in RULE_ROWS) and all(k.ask for k in KNOWN)


@pytest.mark.parametrize("k", TABLE, ids=[k.id for k in TABLE])
def test_row_is_well_formed_and_matches_its_sample(k):
    assert k.key == k.key.lower() and k.key in k.sample.lower()
    m = k.regex().search(k.sample)
    assert m
    if not k.ask:  # the rules search whole messages: the key must be inside every match
        assert k.key in m.group(0).lower()
    assert k.code is None or lookup(k.code).code == k.code  # a declared finding code
    assert set(k.groups) <= GROUPS, k.groups
    assert k.numbers is None or k.numbers in EXTRACTORS
    if not k.ask:
        assert k.source.startswith("rule:") and (k.code or k.groups), "a rule row says who reads it"
    if "crash-route" in k.groups:
        assert k.hint and k.code is None


@pytest.mark.parametrize("k", [k for k in TABLE if k.code], ids=[k.id for k in TABLE if k.code])
def test_a_rows_skill_is_its_findings_skill(k):
    assert k.skill == lookup(k.code).skill


# ----------------------------------------------------------------------------- the matcher
def test_rows_select_by_code_and_group_in_table_order():
    oom = match.rows(code="out-of-memory")
    assert {"cuda-oom", "cpu-alloc-failed", "out-of-memory-any"} <= {k.id for k in oom}
    assert list(oom) == [k for k in TABLE if k in oom]
    routes = match.rows(group="crash-route")
    assert [k.id for k in routes][:2] == ["route-state-dict", "route-unexpected-keys"]
    assert match.groups("peer-gone", "collective-timeout") == failtext.PEER_GONE + failtext.TIMEOUT \
        or set(match.groups("peer-gone", "collective-timeout")) == set(failtext.PEER_GONE + failtext.TIMEOUT)


def test_search_returns_the_first_row_in_the_given_order_with_its_match():
    text = "RuntimeError: NCCL error: a collective failed"
    row, m = match.search(text, match.rows(group="crash-route"))
    assert row.id == "route-nccl" and m.group(0) == "NCCL"
    assert match.search("all good", match.rows(group="crash-route")) is None
    assert match.matches(text, failtext.COLLECTIVE_FAILURE)
    assert not match.matches("ValueError: bad label 7", failtext.COLLECTIVE_FAILURE)


def test_code_of_follows_the_precedence_given():
    both = ("CUDA out of memory while a tensor was modified by an inplace operation; Expected all tensors "
            "to be on the same device")
    assert match.code_of(both, CRASH_CODES) == "out-of-memory"
    assert match.code_of(both, ("device-mismatch", "out-of-memory")) == "device-mismatch"
    assert match.code_of("ValueError: nothing known", CRASH_CODES) is None


def test_case_sensitive_rule_rows_stay_case_sensitive():
    # the crash rule's routes were case-sensitive regexes; in the table they say so with (?-i:...)
    assert match.search("trying to backward through the graph a second time",
                        match.rows(group="crash-route")) is None
    assert match.search("Trying to backward through the graph a second time",
                        match.rows(group="crash-route"))[0].id == "route-backward-twice"
    assert match.search("nccl says no", match.rows(group="crash-route"))[0].id == "route-nccl"


def test_extractors_by_name():
    assert extract("device_details", "found at least two devices, cuda:0 and cpu! (when checking argument "
                   "for argument mat1 in method wrapper_CUDA_addmm)", None) == {
        "devices": ["cuda:0", "cpu"], "argument": "mat1", "op": "wrapper_CUDA_addmm"}
    assert extract("refused_global", "Unsupported global: GLOBAL numpy.dtype was not", None) == {
        "global": "numpy.dtype"}
    assert extract("inplace_details", BY_ID["inplace-modified"].sample, None) == {
        "tensor": "torch.FloatTensor [256, 512]", "output_of": "ReluBackward0", "version": "1 (expected 0)"}
    assert extract(None, "x", None) == {} and extract("oom", "no numbers", None) == {}


# ----------------------------------------------------------------------------- ask and the rules agree
CODED = [k for k in KNOWN if k.code]


@pytest.mark.parametrize("k", CODED, ids=[k.id for k in CODED])
def test_ask_and_the_rules_agree_on_a_pasted_error(k):
    """The row ask decides on for the pasted text carries the finding code the rules raise for it."""
    ans = triage(k.sample, source="stdin")
    assert ans.decisive is not None and ans.decisive.id == k.id
    assert ans.routes and ans.routes[0].skill == lookup(k.code).skill
    if k.code in CRASH_CODES:
        assert classify({"type": "RuntimeError", "message": k.sample}) == k.code
        f = _crash_finding(k.sample)
        assert f.code == k.code and f.skill == ans.routes[0].skill
    else:  # a collective failure: the cross-rank rules read it as that code's text
        assert match.matches(k.sample, CROSS_RANK[k.code])
        assert not failtext.own_crash(_crash_result(k.sample))


def test_every_real_error_the_crash_rule_names_routes_ask_to_the_same_skill():
    seen = 0
    for line in REAL.read_text().splitlines():
        text = json.loads(line)["text"]
        code = classify({"type": "RuntimeError", "message": text})
        if code not in CRASH_CODES:
            continue
        seen += 1
        ans = triage(text, source="stdin")
        assert ans.routes and ans.routes[0].skill == lookup(code).skill == _crash_finding(text).skill, text
    assert seen >= 1  # the CPU wheel raises no CUDA error: the in-place one


def test_oom_numbers_are_the_same_for_ask_and_the_crash_rule():
    text = BY_ID["cuda-oom"].sample
    hit = scan(text).decisive
    crash_ev = _crash_finding(text).evidence
    for name, value in oom_details(text).items():
        assert hit.numbers[name] == value == crash_ev[name], name
    assert crash_ev["requested_bytes"] == 2 * 2**30 and crash_ev["gpu"] == 0


def test_crash_oom_numbers_in_decimal_units_and_the_older_wording():
    # the crash rule's own byte parser read neither "256.00 MB" (MPS) nor the torch < 2.1 wording
    # "(GPU 0; 15.78 GiB total capacity; ...; 3.44 MiB free; ...)": requested_bytes was null
    mps = oom_details(BY_ID["mps-oom"].sample)
    assert mps["requested_bytes"] == 256 * 10**6 and mps["allocated_bytes"] == 17_010_000_000
    old = oom_details("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; "
                      "14.50 GiB already allocated; 3.44 MiB free; 14.60 GiB reserved in total by PyTorch)")
    assert old["requested_bytes"] == 20 * 2**20 and old["gpu"] == 0
    assert old["capacity_bytes"] == round(15.78 * 2**30) and old["free_bytes"] == round(3.44 * 2**20)


def test_a_broad_rule_row_is_not_read_by_ask():
    # "out of memory" alone is an out-of-memory crash for the crash rule, but prose for ask
    text = "my job says something about running out of memory sometimes"
    assert classify({"type": "RuntimeError", "message": text}) == "out-of-memory"
    assert all(h.entry.ask for h in scan(text).known)
    assert not any(h.entry.id == "out-of-memory-any" for h in scan(text).known)


def test_cross_rank_failure_lines_come_from_the_tables_groups():
    from torchdoctor.rules.ranks import crashed_ranks, failure_lines

    ev = Evidence(meta={"world_size": 2}, events=[
        {"kind": "rank_result", "rank": 0, **_crash_result(
            "[pair.cc:534] Connection closed by peer [127.0.0.1]:29500")},
        {"kind": "rank_result", "rank": 1, **_crash_result("bad batch at step 3")}],
        result={"output_tail": ["  File \"x.py\", line 3, in f: NCCL", "[E ProcessGroupNCCL.cpp:1] Watchdog "
                                "caught collective operation timeout: WorkNCCL(SeqNum=4)", "loss 0.3"]})
    assert failure_lines(ev) == [
        "rank 0: [pair.cc:534] Connection closed by peer [127.0.0.1]:29500",
        "[E ProcessGroupNCCL.cpp:1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4)"]
    assert failure_lines(ev, failtext.MISMATCH) == []
    assert crashed_ranks(ev) == [1]  # rank 0's error is a consequence of rank 1's own crash
