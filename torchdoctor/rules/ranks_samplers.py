"""Cross-rank DataLoader rules of a ranked run (probe ``"ranks"``): missing-distributed-sampler
(every rank reads the same samples) and sampler-epoch-not-set (a shuffling DistributedSampler
repeats its order every epoch), from the ranks' DataLoader facts and first-batch fingerprints.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from torchdoctor.catalog import declare
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.rules.ranks import rname, world_of
from torchdoctor.runner.frames import short_path
from torchdoctor.skills import DISTRIBUTED

MISSING_DISTRIBUTED_SAMPLER = declare("missing-distributed-sampler", DISTRIBUTED, "error",
                                      "every rank reads the same samples")
SAMPLER_EPOCH_NOT_SET = declare("sampler-epoch-not-set", DISTRIBUTED, "warning",
                                "DistributedSampler.set_epoch not called between epochs")


def _loaders(ev: Evidence, events: list[dict[str, Any]] | None = None
             ) -> dict[tuple, dict[int, list[dict[str, Any]]]]:
    """(loader index, loop site) -> {rank: its dist_loader events, one per epoch}."""
    out: dict[tuple, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for e in (ev.of("dist_loader") if events is None else events):
        out[(e.get("loader"), e.get("site"))][int(e["rank"])].append(e)
    return out


@rule("missing-distributed-sampler", probes={"ranks"}, needs={"dist_loader", "dist_batch"},
      raises=[MISSING_DISTRIBUTED_SAMPLER])
def missing_distributed_sampler(ev: Evidence) -> list[Finding]:
    world = world_of(ev)
    if world < 2:
        raise NotApplicable("one rank")
    loaders = _loaders(ev)
    if not loaders:
        raise NotApplicable("no DataLoader was iterated")
    prints = {(int(e["rank"]), e.get("loader")): e.get("fingerprint") for e in ev.of("dist_batch")}
    findings, why_not = [], []
    for (idx, site), by_rank in sorted(loaders.items(), key=lambda kv: str(kv[0])):
        if len(by_rank) < world:
            continue  # not iterated on every rank (e.g. evaluation on rank 0 only)
        first = {r: evs[0] for r, evs in by_rank.items()}
        if any((e.get("world_size") or 1) < 2 for e in first.values()):
            why_not.append(f"loader at {short_path(site)}: iterated outside a process group")
            continue
        kinds = {e.get("sampler_kind") for e in first.values()}
        if kinds != {"stock"}:
            continue
        fps = {r: prints.get((r, idx)) for r in by_rank}
        if None in fps.values() or len(set(fps.values())) != 1:
            why_not.append(f"loader at {short_path(site)}: the ranks' first batches differ "
                           f"(shuffled with different seeds, or per-rank data): not judged")
            continue
        e0 = first[min(first)]
        sampler = e0.get("sampler")
        evidence = {"loop": short_path(site), "sampler": sampler, "dataset": e0.get("dataset"),
                    "dataset_len": e0.get("dataset_len"),
                    "batches_per_epoch": {rname(r): e.get("batches") for r, e in sorted(first.items())},
                    "first_batch": f"identical on all {world} ranks (content fingerprint)"}
        findings.append(finding(
            "missing-distributed-sampler",
            f"every rank reads the same samples: the DataLoader at {short_path(site)} draws from "
            f"a {sampler} over the whole {e0.get('dataset')} ({e0.get('dataset_len')} samples) "
            f"on each of the {world} ranks; their first batches were identical",
            evidence,
            fix="Pass sampler=DistributedSampler(dataset) to the DataLoader (drop shuffle=True: the "
                "sampler shuffles) and call sampler.set_epoch(epoch) at the start of each epoch; "
                "each rank then reads 1/world_size of the data per epoch"))
    if not findings and why_not and not any(
            {e[0].get("sampler_kind") for e in by.values()} == {"distributed"} for by in loaders.values()):
        raise NotApplicable("; ".join(why_not[:3]))
    return findings


def _training_epochs(ev: Evidence) -> list[dict[str, Any]]:
    """The ``dist_loader`` events of iterators that fed training steps: the epochs.

    An iterator counts when an optimizer step happened between its creation and the next
    iterator of the same loader on the same rank (or the end of the run), wherever in the
    script either was made. One made and dropped with no step in between is a peek, e.g. the
    DDP tutorial's ``len(next(iter(loader))[0])`` before ``set_epoch``: it holds the previous
    epoch's number and is not an epoch. Events without a step count (older evidence) all count.
    """
    last_step: dict[int, int] = {}
    for s in ev.of("step"):
        if s.get("rank") is not None and s.get("step") is not None:
            r = int(s["rank"])
            last_step[r] = max(last_step.get(r, 0), int(s["step"]))
    per: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for e in ev.of("dist_loader"):
        per[(int(e["rank"]), e.get("loader"))].append(e)
    keep: list[dict[str, Any]] = []
    for (rank, _idx), evs in per.items():
        evs = sorted(evs, key=lambda e: e.get("iter") or 0)
        for i, e in enumerate(evs):
            made = e.get("step")
            end = evs[i + 1].get("step") if i + 1 < len(evs) else last_step.get(rank)
            if made is None or end is None or int(end) > int(made):
                keep.append(e)
    return keep


@rule("sampler-epoch-not-set", probes={"ranks"}, needs={"dist_loader", "step"},
      raises=[SAMPLER_EPOCH_NOT_SET])
def sampler_epoch_not_set(ev: Evidence) -> list[Finding]:
    world = world_of(ev)
    if world < 2:
        raise NotApplicable("one rank")
    loaders = _loaders(ev, _training_epochs(ev))
    judged = 0
    hits: dict[tuple, dict[int, list]] = {}
    for key, by_rank in loaders.items():
        for r, evs in by_rank.items():
            if evs[0].get("sampler_kind") != "distributed" or not evs[0].get("shuffle"):
                continue
            if len(evs) < 2:
                continue
            judged += 1
            epochs = [e.get("epoch") for e in evs]
            if any(a == b for a, b in zip(epochs, epochs[1:])):
                hits.setdefault(key, {})[r] = epochs
    if not judged:
        if any(by[r][0].get("sampler_kind") == "distributed" for by in _loaders(ev).values() for r in by):
            raise NotApplicable("no shuffling DistributedSampler fed training steps for two epochs")
        raise NotApplicable("no DataLoader with a DistributedSampler")
    out = []
    for (idx, site), by_rank in hits.items():
        ranks = sorted(by_rank)
        epochs = by_rank[ranks[0]]
        out.append(finding(
            "sampler-epoch-not-set",
            f"DistributedSampler.set_epoch is not called between epochs: the DataLoader at "
            f"{short_path(site)} ran {len(epochs)} epochs with the sampler's epoch at "
            f"{epochs}, so every epoch repeats the same shuffled order",
            {"loop": short_path(site), "sampler_epochs": epochs, "epochs_run": len(epochs),
             "ranks": "all" if len(ranks) == world else [rname(r) for r in ranks]},
            fix="Call loader.sampler.set_epoch(epoch) at the start of every epoch, before "
                "iterating the DataLoader"))
    return out
