"""Issue 13 (training/perf rules): regressions on fixtures written in the style of real scripts.

Items: 5 (sampler epochs judged by the iterators that fed steps), 6 (data wait attributed to the
loader that fed the steps; transforms are not models), 11 (file:line for missing-zero-grad,
eval-mode-training, params-not-in-optimizer), 16 (one statistic in the step table),
18 (profile hotspots name the function's definition line).
"""

from __future__ import annotations

from torchdoctor.instruments._profile_analysis import Sources, analyze

US = 1000  # ns

# --------------------------------------------------------------------------- item 18
# A script in the style of pytorch/examples: the loop lives in train(); the profiler window opens
# while train() is already running, so the tracer names it with the line *then running*.
TRAIN_PY = '''import torch


def tokenize(text):
    return [ord(c) % 97 for c in text]


@torch.no_grad()
def evaluate(model):
    return 0.0


def train(model, opt, data):
    for step, (x, y) in enumerate(data):
        ids = tokenize("a sentence" * 8)
        loss = model(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    train(None, None, [])
'''.splitlines()


def _src() -> Sources:
    return Sources(is_user=lambda f: f == "train.py", show=lambda f: f,
                   code=lambda f, n: TRAIN_PY[n - 1].strip() if f == "train.py" and 0 < n <= len(TRAIN_PY) else "")


def _flat_with_running_frames() -> dict:
    nodes: list = []

    def node(parent, tag, name, start, end, **extra):
        nodes.append([len(nodes), parent, tag, name, 1, start * US, end * US, extra])
        return len(nodes) - 1

    for i, t in enumerate((0, 2000, 4000)):
        s = node(-1, "op", f"ProfilerStep#{i + 1}", t, t + 2000, corr=i + 1, user=True, **{"in": []})
        # frames already running when the window opened: named with their running line
        mod = node(s, "py", "train.py(23): <module>", t, t + 1900, file="train.py", line=23, func="<module>")
        loop = node(mod, "py", "train.py(18): train", t + 10, t + 1890, file="train.py", line=23, func="train")
        # a function called inside the window: named with its def line by the tracer
        node(loop, "py", "train.py(4): tokenize", t + 20, t + 820, file="train.py", line=15, func="tokenize")
        node(loop, "py", "train.py(10): evaluate", t + 900, t + 1000, file="train.py", line=16,
             func="evaluate")
        node(loop, "op", "aten::addmm", t + 1000, t + 1100, corr=100 + i, **{"in": []})
    return {"version": 1, "nodes": nodes, "device": [], "runtime": []}


def test_python_hotspots_name_the_definition_line_not_the_running_line():
    hot = {h["func"]: h["def"] for h in analyze(_flat_with_running_frames(), _src())["profile_python"]["functions"]}
    assert hot["train"] == "train.py:13"  # def train(...), not line 18 (opt.step() then running)
    assert hot["<module>"] == "train.py:1"
    assert hot["tokenize"] == "train.py:4"
    assert hot["evaluate"] == "train.py:8"  # a decorated function is defined at its decorator


def test_def_line_keeps_the_line_when_the_source_is_unknown():
    src = Sources(is_user=lambda f: True)
    assert src.def_line("train.py", 18, "train") == 18
    assert src.def_line("train.py", 7, "<lambda>") == 7
