"""The routing table as data: how users describe each skill's problems, and how much each says.

Each ``Signal`` is a regex over normalised text (lower case, typos fixed; see ``text``):

- ``kind``: ``symptom`` (something observed: OOM, NaN, slow, hang), ``topic`` (what they want to
  do: save a model, set up DDP, use AMP) or ``context`` (a setting that changes the order: "on 8 GPUs").
- ``weight``: 1 = generic ("distributed", "multi-gpu"): never enough alone (the query is vague and
  gets a clarifying question) but adds its skill beside a clear one; 2 = specific; 3 = decisive.
- ``consume``: blank the matched words so that later, more generic patterns do not read them again
  ("activation checkpointing" is memory, not checkpointing; "pin_memory" is data loading).
- ``prefer``: skills that take the signal over when they are present too ("hangs" alone is
  debugging; with DDP it is distributed; with a DataLoader it is performance).
- ``variant``: the playbook variant (``playbooks.VARIANTS``, named by its command) that serves this
  signal better than the skill's default probe: torch.compile symptoms -> ``compile``, reproducibility
  and seeds -> ``repro``. A route takes the variant of its strongest signal that has one, unless a
  stronger signal of the same route has none.

Patterns are tried in the order listed. Labels are the routing table's words and show in the why.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchdoctor.skills import (
    CHECKPOINTING,
    CUSTOM_AUTOGRAD,
    DEBUGGING,
    DISTRIBUTED,
    MIXED_PRECISION,
    MODULE_DESIGN,
    PERFORMANCE,
    TENSOR_MEMORY,
)

MEM, MOD, DIST, MP = TENSOR_MEMORY, MODULE_DESIGN, DISTRIBUTED, MIXED_PRECISION
PERF, DBG, CKPT, AG = PERFORMANCE, DEBUGGING, CHECKPOINTING, CUSTOM_AUTOGRAD

SYMPTOM, TOPIC, CONTEXT = "symptom", "topic", "context"


@dataclass(frozen=True)
class Signal:
    skill: str
    kind: str
    weight: int
    label: str
    pattern: str
    consume: bool = False
    prefer: tuple[str, ...] = ()
    variant: str | None = None


def S(skill, kind, weight, label, pattern, consume=False, prefer=(), variant=None):  # noqa: N802 - table shorthand
    return Signal(skill, kind, weight, label, pattern, consume, tuple(prefer), variant)


COMPILE, REPRO, ATTACH = "compile", "repro", "attach"  # playbook variants (playbooks.VARIANTS)
# known error texts (errortext table ids) whose route is a playbook variant
ERROR_VARIANTS = {"recompile-limit": COMPILE, "graph-break": COMPILE, "dynamo-unsupported": COMPILE,
                  "backend-compiler-failed": COMPILE, "inductor-error": COMPILE,
                  "cudagraph-skipped": COMPILE, "deterministic-cublas": REPRO, "nondeterministic-op": REPRO}


# "N GPUs" with N > 1 (a single GPU is not distributed)
_MANY = r"(?:[2-9]|[1-9]\d+|two|three|four|eight|sixteen|multiple|several|many|more|all)"
_GPUS = r"(?:gpus|cards|devices|a100s|h100s|h200s|v100s|a10gs|t4s|3090s|4090s)"
_SIZE = r"\d+(?:\.\d+)?\s*(?:gb|gib|mb|mib|g)\b"
# a job that hangs or slowed down *now*, while it runs: diagnosed live (`attach`), not re-run
_STALL = (r"(?:hangs?|hanging|hung|stuck|frozen|freez\w*|stall(?:s|ed|ing)?|no\s+progress|slow(?:ed|s|ing)?"
          r"\s+down|(?:got|gets|getting|became|is|went)\s+(?:much\s+|very\s+|really\s+)?slow\w*)")
_LIVE = (r"(?:now|right\s+now|currently|at\s+the\s+moment|after\s+(?:\d+|a\s+few|several|many|two|three)"
         r"\s+(?:hours?|days?|epochs?)|for\s+(?:\d+|a\s+few|several|many|the\s+last|two|three)\s+(?:hours?|days?))")

SIGNALS: tuple[Signal, ...] = (
    # ---- phrases that would otherwise be misread: consumed first -----------------------------
    S(MEM, TOPIC, 2, "activation checkpointing",
      r"\b(?:activation|gradient|grad)\s+checkpoint\w*|\btorch\.utils\.checkpoint\b|\bcheckpoint_sequential\b",
      consume=True),
    S(PERF, CONTEXT, 1, "DataLoader settings", r"\bpin_memory\b|\bnum_workers\b|\bpersistent_workers\b|"
      r"\bprefetch_factor\b", consume=True),
    S(MEM, SYMPTOM, 3, "memory profiling", r"\b(?:memory|mem)\s+(?:profil\w*|snapshot\w*|timeline)\b|"
      r"\bprofil\w*\s+(?:the\s+|gpu\s+|cuda\s+)?memory\b", consume=True),
    S(CKPT, TOPIC, 3, "save model", r"\bsav(?:e|es|ed|ing)\b[^.?!\n]{0,40}?\b(?:models?|weights|state|state_dicts?|"
      r"checkpoints?|optimizer|training|scheduler|scaler|progress)\b", consume=True),
    S(CKPT, SYMPTOM, 3, "resume training", r"\bresum\w*\b|\brestart\w*\s+(?:the\s+)?training\b|"
      r"\bpre-?empt\w*|\bpick\s+up\s+where\b|\bwhere\s+i\s+left\s+off\b"),
    S(MOD, SYMPTOM, 2, "parameters never updated / grad is None",
      r"\bgrad(?:ient)?s?\s+(?:is|are|=|==)\s+none\b|\bgrad(?:ient)?s?\s+none\b|\.grad\s+is\s+none|"
      r"\b(?:parameters?|weights?|layers?)\b[^.?!\n]{0,30}\b(?:not|never|don'?t|aren'?t|doesn'?t)\s+"
      r"(?:being\s+|get\s+|getting\s+)?(?:updat\w*|chang\w*|train\w*)|\b(?:not|don'?t|doesn'?t)\s+"
      r"(?:show\s+up|appear)\b[^.?!\n]{0,30}\bparameters|\bempty\s+parameter\s+list\b|"
      r"\bparameters\(\)[^.?!\n]{0,20}\bempty\b",
      consume=True),
    S(MOD, TOPIC, 2, "freeze layers", r"\b(?:freez\w*|unfreez\w*)\b[^.?!\n]{0,30}\b(?:layers?|encoder|backbone|"
      r"weights|parameters|model|head|bert|resnet)\b|\brequires_grad\s*=?\s*(?:false|_\(false\))", consume=True),
    S(DBG, SYMPTOM, 2, "hang / freeze", r"\b(?:hangs?|hanging|hung|freez\w*|frozen|stuck|deadlock\w*|"
      r"stall(?:s|ed|ing)?|never\s+(?:returns|finishes|ends)|no\s+progress)\b",
      prefer=(DIST, PERF)),
    # ---- memory -------------------------------------------------------------------------------
    S(MEM, SYMPTOM, 3, "CUDA out of memory", r"\bout[\s-]*of[\s-]*(?:gpu\s+|cuda\s+|device\s+|host\s+|cpu\s+)?"
      r"mem(?:ory|eory)?\b|\bo\.?o\.?m(?:s|ed|ing)?\b|\boom-?killer\b|\boutofmemoryerror\b|"
      r"\bcan'?t\s+allocate\b|\bfailed\s+to\s+allocate\b|\ballocation\s+(?:error|fail\w*)"),
    S(MEM, SYMPTOM, 3, "memory keeps growing / leak",
      r"\b(?:memory|mem|vram|ram|allocated)\b[^.?!\n]{0,40}\b(?:grow\w*|increas\w*|climb\w*|"
      r"(?:keeps?|kept)\s+(?:going\s+up|rising|increasing|growing|climbing)|go(?:es|ing)?\s+up|ris(?:es|ing)|"
      r"explod\w*|leak\w*|creep\w*|balloon\w*|accumulat\w*)|\bleak\w*\b[^.?!\n]{0,30}\b(?:memory|mem|vram|ram)\b|"
      r"\b(?:memory|mem)\s+leak"),
    S(MEM, SYMPTOM, 3, "reserved much larger than allocated (fragmentation)",
      r"\breserved\b[^.?!\n]{0,50}\ballocated\b|\ballocated\b[^.?!\n]{0,50}\breserved\b|\bfragment\w*\b"),
    S(MEM, TOPIC, 2, "reduce memory", r"\b(?:reduce|lower|decrease|cut|save|saving|minimi[sz]e|less)\s+"
      r"(?:\w+\s+){0,2}(?:gpu\s+|cuda\s+)?(?:memory|vram|mem)\b"),
    S(MEM, SYMPTOM, 2, "GPU memory usage too high",
      r"\b(?:memory|mem|vram|ram)\s+(?:usage|use|consumption|footprint|requirements?)\b|"
      r"\b(?:uses?|using|takes?|taking|consumes?|needs?|eats?)\s+(?:\w+\s+){0,2}(?:more|"
      r"too\s+much|a\s+lot\s+of|lots\s+of|so\s+much|way\s+more)\s+(?:gpu\s+|cuda\s+)?(?:memory|vram|ram)\b|"
      r"\bpeak\s+(?:gpu\s+|cuda\s+)?memory\b|\bnvidia-smi\b[^.?!\n]{0,40}" + _SIZE + r"|"
      r"\bfit\b[^.?!\n]{0,40}(?:" + _SIZE + r"|\bmemory\b|\bvram\b|\bon\s+(?:a|one|my)\s+(?:gpu|card))"),
    S(MEM, TOPIC, 2, "gradient accumulation", r"\bgrad(?:ient)?\s+accumulat\w*|\baccumulat\w*\s+(?:the\s+)?"
      r"grad\w*"),
    S(MEM, TOPIC, 2, "GPU memory", r"\b(?:gpu|cuda|device)\s+memory\b|\bvram\b|\bmemory_allocated\b|"
      r"\bempty_cache\b|\bmax_split_size_mb\b|\bexpandable_segments\b|\bpytorch_(?:cuda_)?alloc_conf\b"),
    S(MEM, TOPIC, 2, "tensor memory / views", r"\b(?:contiguous|non-contiguous|in-?place\s+ops?|"
      r"\.view\(|\.reshape\(|strides?|storage)\b"),
    S(MEM, CONTEXT, 1, "memory", r"\bmemory\b|\bram\b"),
    # ---- distributed --------------------------------------------------------------------------
    S(DIST, SYMPTOM, 3, "NCCL", r"\bnccl\w*\b"),
    S(DIST, SYMPTOM, 3, "collective timeout / mismatch", r"\b(?:all_?reduce|all_?gather|reduce_scatter|"
      r"broadcast|barrier|collectives?)\b[^.?!\n]{0,40}\b(?:timeout|timed\s+out|hangs?|stuck|mismatch\w*)\b|"
      r"\bwatchdog\b|\baddress\s+already\s+in\s+use\b|\beaddrinuse\b|\bdesync\w*"),
    S(DIST, SYMPTOM, 3, "a running job hangs or slowed down now",
      r"\b" + _STALL + r"\b[^.?!\n]{0,60}\b" + _LIVE + r"\b|\b" + _LIVE + r"\b[^.?!\n]{0,60}\b" + _STALL
      + r"\b|\bwithout\s+restart\w*|\battach\s+to\b[^.?!\n]{0,30}\b(?:job|process|run|training)\b",
      variant=ATTACH),
    S(DIST, TOPIC, 2, "DistributedDataParallel", r"\bddp\b|\bdistributeddataparallel\b|\bdistributed\s+data\s+"
      r"parallel\b"),
    S(DIST, TOPIC, 2, "FSDP / sharding", r"\bfsdp\d?\b|\bfully[\s_]*sharded\w*|\bzero[\s-]?[123]\b|"
      r"\bdeepspeed\b|\b(?:tensor|pipeline|model|sequence|context)[\s-]+parallel\w*"),
    S(DIST, TOPIC, 2, "launch: torchrun", r"\btorchrun\b|\btorch\.distributed\.(?:launch|run)\b|"
      r"\bmp\.spawn\b|\btorch\.multiprocessing\b|\bslurm\b|\bsrun\b|\bmaster_(?:addr|port)\b"),
    S(DIST, TOPIC, 2, "torch.distributed", r"\btorch\.distributed\b|\binit_process_group\b|\bprocess\s+groups?\b|"
      r"\bdist\.\w+|\bgloo\b|\ball_?reduce\b|\ball_?gather\b|\bcollectives?\b"),
    S(DIST, TOPIC, 2, "DistributedSampler / per-rank data", r"\bdistributedsampler\b|\bset_epoch\b|"
      r"\bfind_unused_parameters\b|\bsync_?batch_?norm\b|\bbucket_cap_mb\b|\bno_sync\b|\bdataparallel\b"),
    S(DIST, SYMPTOM, 2, "ranks / world size", r"\b(?:each|every|other|all|different)\s+ranks?\b|\brank\s*\d+\b|"
      r"\branks\b|\bworld[_\s]size\b|\blocal[_\s]rank\b"),
    S(DIST, TOPIC, 2, "multi-node", r"\bmulti[\s-]*(?:node|host|machine)s?\b|\b(?:\d+|two|several|many|second|"
      r"multiple|more)\s+(?:nodes|machines|hosts)\b|\binter-?node\b|\bacross\s+(?:both\s+|two\s+)?(?:nodes|"
      r"machines)\b"),
    S(DIST, TOPIC, 2, "split work across processes", r"\bacross\s+(?:\d+\s+|all\s+|the\s+)?(?:processes|ranks|"
      r"gpus|nodes|devices|machines)\b|\bshard\w*\b[^.?!\n]{0,20}\bdata\w*|\bper[\s-]+rank\b"),
    S(DIST, TOPIC, 2, "scale to N GPUs", r"\bscal\w*\b[^.?!\n]{0,30}\b" + _MANY + r"?\s*" + _GPUS),
    S(DIST, CONTEXT, 1, "multiple GPUs", r"\b" + _MANY + r"\s*(?:x\s*)?" + _GPUS + r"|\bmulti[\s-]*gpus?\b|"
      r"\b\d+x\s*(?:a100|h100|h200|v100)\b"),
    S(DIST, CONTEXT, 1, "distributed", r"\bdistributed\b|\bdistribute\b|\bscal(?:e|ing)\s+out\b"),
    # ---- performance --------------------------------------------------------------------------
    S(PERF, SYMPTOM, 3, "iterations per second / throughput",
      r"\b(?:it|its|iters?|iterations?|steps?|samples?|images?|imgs?|tokens?|batch(?:es)?|examples?)\s*"
      r"(?:/|per)\s*(?:s|sec|second)\b|\bthroughput\b|\blatency\b|\bsamples/sec\b"),
    S(PERF, SYMPTOM, 3, "low GPU utilization", r"\b(?:gpu|cuda|device)\s+(?:util\w*|usage|load|busy)\b|"
      r"\butili[sz]ation\b|\bgpu\s+(?:is\s+|sits\s+|stays\s+)?idle\b|\bidle\b|\b\d{1,3}\s*%\s*(?:util\w*|usage|"
      r"load|busy)\b|\butil\b|\bbarely\s+(?:used|utili[sz]ed|busy|working)\b|\bunder-?utili[sz]\w*"),
    S(PERF, SYMPTOM, 3, "CPU/GPU/data bound", r"\b(?:cpu|gpu|io|i/o|data|input|compute|launch|memory|"
      r"bandwidth)[\s-]+bound\b"),
    S(PERF, SYMPTOM, 3, "torch.compile slow / not faster",
      r"\bcompil\w*\b[^.?!\n]{0,40}\b(?:slow\w*|not\s+(?:any\s+)?faster|no\s+faster|(?:no|tiny|small|little)\s+"
      r"speed-?ups?|takes?\s+(?:forever|ages|too\s+long|minutes|so\s+long))\b|\b(?:slow|long)\s+compil\w*|"
      r"\btakes?\s+(?:forever|ages|too\s+long|minutes)\s+to\s+compil\w*|\b(?:not\s+(?:any\s+)?faster|no\s+"
      r"speed-?up|slower)\b[^.?!\n]{0,40}\b(?:with|after|under|using)\s+(?:torch\.)?compil\w*",
      consume=True, variant=COMPILE),
    S(PERF, SYMPTOM, 2, "training too slow", r"\bslow\w*\b|\bsluggish\b|\btakes?\s+(?:forever|ages|too\s+long|"
      r"so\s+long|hours|days)|\btoo\s+long\b|\bforever\b|\b(?:epoch|step|iteration|batch)e?s?\s+takes?\b"),
    S(PERF, SYMPTOM, 2, "speed up training", r"\bspeed\s*(?:it\s+|this\s+|things\s+)?up\b|\bspeed-?ups?\b|"
      r"\bfaster\b|\bquicker\b|\baccelerat\w*\b|\bperformance\s+(?:optimi[sz]ation|tuning|problem|issue)s?\b"),
    S(PERF, SYMPTOM, 3, "bottleneck / profiling", r"\bbottleneck\w*\b|\bprofil\w*\b|\bstep\s+time\b|"
      r"\bwhere\s+(?:the\s+|my\s+)?time\s+(?:goes|is\s+spent|is\s+going)\b|\bwhat'?s\s+slowing\b|"
      r"\bspends?\s+(?:its\s+|the\s+|most\s+(?:of\s+)?(?:its\s+|the\s+)?)?time\b|\btime\s+is\s+spent\b"),
    S(PERF, TOPIC, 2, "torch.compile", r"\btorch\.compile\b|\bgraph\s+breaks?\b|\brecompil\w*\b|\bdynamo\b|"
      r"\binductor\b|\bcompil(?:e|ed|ing)\s+(?:my\s+|the\s+)?model\b", variant=COMPILE),
    S(PERF, TOPIC, 2, "CUDA graphs", r"\bcuda\s*graphs?\b"),
    S(PERF, CONTEXT, 1, "data loading", r"\bdata\s*loader\w*|\bdataloader\w*|\bdata\s+loading\b|"
      r"\bdata\s+pipeline\b|\bworkers\b"),
    S(PERF, CONTEXT, 1, "performance", r"\bperformance\b|\bspeed\b|\bfast\b"),
    # ---- mixed precision ----------------------------------------------------------------------
    S(MP, TOPIC, 3, "mixed precision / AMP", r"\bmixed[\s-]*precision\b|\bautocast\b|\btorch\.(?:cuda\.)?amp\b|"
      r"\bamp\b|\bautomatic\s+mixed\b"),
    S(MP, TOPIC, 3, "gradient scaling", r"\bgrad\s*scaler\b|\bgradscaler\b|\bloss[\s-]+scal\w*|\bscaler\b"),
    S(MP, TOPIC, 2, "FP16 / BF16", r"\bfp16\b|\bfloat16\b|\bhalf[\s-]*precision\b|\.half\(\)|\bbf16\b|"
      r"\bbfloat16\b|\bfp8\b|\bfloat8\b|\blower\s+precision\b|\bhalf\s+floats?\b"),
    S(MP, TOPIC, 2, "TF32", r"\btf32\b|\btensorfloat\w*|\bset_float32_matmul_precision\b|\ballow_tf32\b"),
    # ---- debugging ----------------------------------------------------------------------------
    S(DBG, SYMPTOM, 3, "NaN / Inf", r"\bnans?\b|\bnan'?s\b|\binfs?\b|\binfinity\b|\bnon-?finite\b|"
      r"\bnot\s+finite\b|\bisnan\b|\bisfinite\b"),
    S(DBG, SYMPTOM, 3, "loss exploding", r"\b(?:loss|gradients?|grads?|outputs?|logits|activations|weights|"
      r"values?|norms?)\b[^.?!\n]{0,40}\b(?:explod\w*|blow\w*\s+up|blew\s+up|diverg\w*|"
      r"spik(?:e|es|ed|ing)\b(?!\s+neur)|shoots?\s+up|"
      r"shot\s+up|overflow\w*|goes\s+to\s+infinity)|\b(?:exploding|vanishing)\s+(?:gradients?|loss)\b|"
      r"\bgradients?\s+(?:explo\w*|vanish\w*)|\bgradient\s+explosion\b|\bdiverg\w*\b|\bloss\s+spikes?\b"),
    S(DBG, SYMPTOM, 2, "training unstable", r"\bunstable\b|\binstabilit\w*\b|\bnumerical(?:ly)?\s+(?:issues?|"
      r"problems?|errors?|stabilit\w*)\b|\bvanish\w*\b"),
    S(DBG, SYMPTOM, 2, "not learning", r"\b(?:not|isn'?t|doesn'?t|don'?t|never|won'?t|stopped)\s+"
      r"(?:learning|learn|converg\w*|decreas\w*|improv\w*|going\s+down|go(?:es)?\s+down|training)\b|"
      r"\b(?:loss|accuracy|metric)\b[^.?!\n]{0,30}\b(?:stays?|stuck|flat|plateau\w*|constant|doesn'?t\s+move)\b"),
    S(DBG, SYMPTOM, 2, "impossible values", r"\b(?:loss|probabilit\w*|accuracy|perplexity)\b[^.?!\n]{0,30}\b"
      r"(?:negative|below\s+zero|above\s+1|greater\s+than\s+1|impossible)\b"),
    S(DBG, SYMPTOM, 2, "wrong / constant outputs", r"\boutputs?\b[^.?!\n]{0,30}\b(?:all\s+(?:zeros?|ones|"
      r"the\s+same)|zeros?|constant|identical|garbage)\b|\bpredicts?\s+(?:the\s+same|only\s+one)\b"),
    S(DBG, SYMPTOM, 2, "gradients accumulate / zero_grad", r"\bgrad(?:ient)?s\s+(?:keep\s+|are\s+)?accumulat\w*|"
      r"\bzero_grad\b|\bzero\s+(?:the\s+)?grad\w*"),
    S(DBG, TOPIC, 2, "gradient clipping", r"\bgrad(?:ient)?[\s_-]+(?:norm\s+)?clip\w*|\bclip(?:ping)?\s+(?:the\s+)?"
      r"grad\w*|\bclip_grad\w*"),
    S(DBG, TOPIC, 2, "anomaly detection", r"\bdetect_anomaly\b|\banomaly\s+(?:mode|detection)\b|"
      r"\bcuda_launch_blocking\b|\bdevice-side\s+assert\b"),
    S(DBG, CONTEXT, 1, "debugging", r"\bdebug\w*\b|\bcrash\w*\b|\bsegfault\w*\b|\bsegmentation\s+fault\b"),
    # ---- checkpointing / reproducibility ------------------------------------------------------
    S(CKPT, TOPIC, 3, "checkpoint", r"\bcheckpoint\w*\b|\bckpt\b|\btorch\.(?:save|load)\b|\bstate_dicts?\b|"
      r"\bload_state_dict\b|\bsafetensors\b|\b\w+\.(?:pth?|ckpt|bin)\b|\bweights_only\b"),
    S(CKPT, TOPIC, 3, "reproducible training", r"\breproduc\w*|\bdeterminis\w*|\bnon-?determinis\w*|"
      r"\bbit-?exact\b|\b(?:results?|loss\w*|runs?|numbers|outputs?)\b[^.?!\n]{0,30}\b(?:differ\w*|vary|varies|"
      r"change)\b[^.?!\n]{0,30}\b(?:between|across|each|every|from)\s+(?:runs?|run\s+to\s+run|time|restarts?)\b|"
      r"\bsame\s+seed\b|\bdifferent\s+results\b[^.?!\n]{0,20}\bruns?\b|\b(?:two|2|both|separate|repeated|"
      r"identical)\s+runs\b[^.?!\n]{0,60}\b(?:differ\w*|different)\b|\bsame\s+(?:config\w*|settings|code|"
      r"hyperparameters|script)\b[^.?!\n]{0,60}\b(?:differ\w*|different)\b", variant=REPRO),
    S(CKPT, TOPIC, 2, "seeds / RNG state", r"\bseeds?\b|\bseeding\b|\bmanual_seed\b|\brng\b|\brandom\s+state\b", variant=REPRO),
    S(CKPT, TOPIC, 2, "load pretrained weights", r"\bpretrained\s+(?:weights|model|checkpoint)\b|"
      r"\bload(?:ing|s|ed)?\b[^.?!\n]{0,30}\b(?:weights|checkpoint|pretrained|saved\s+model)\b"),
    # ---- module design ------------------------------------------------------------------------
    S(MOD, TOPIC, 2, "custom layer", r"\b(?:custom|hand-?written|handwritten|home-?made|self-?written|hand-?rolled)\s+"
      r"(?:nn\.)?(?:\w+\s+)?(?:layers?|modules?|blocks?|resnet|"
      r"architecture|variant|heads?|network|encoder|decoder|attention)\b|\b(?:my|our)\s+own\s+"
      r"(?:\w+\s+)?(?:layers?|modules?|blocks?)\b"),
    S(MOD, TOPIC, 2, "nn.Module best practices", r"\bnn\.module\b|\bsubmodules?\b|\bmodulelist\b|\bmoduledict\b|"
      r"\bnn\.sequential\b|\bregister_buffer\b|\bnn\.parameter\b|\bregister_parameter\b|\bbuffers?\b"),
    S(MOD, TOPIC, 2, "model structure", r"\b(?:structure|organi[sz]e|design|layout|split|break)\w*\b"
      r"[^.?!\n]{0,40}\b(?:model|network|net|modules?|layers?|classes|components|code)\b|"
      r"\bmodel\s+(?:components|architecture\s+implementation)\b|\binto\s+nn\.modules\b"),
    S(MOD, TOPIC, 2, "parameter initialization", r"\b(?:initiali[sz]\w*|init)\b[^.?!\n]{0,30}\b(?:weights?|"
      r"parameters?|layers?|modules?|model|biases?)\b|\b(?:weight|parameter|module|model)\s+initiali[sz]ation\b|"
      r"\bkaiming\b|\bxavier\b|\bglorot\b|\breset_parameters\b|\bnn\.init\b"),
    S(MOD, TOPIC, 2, "change a model's layers", r"\b(?:add|insert|replace|remove|swap|chang|modify|modifi)\w*\b"
      r"[^.?!\n]{0,30}\b(?:layers?|dropout|heads?|classifier|batch\s*norm|batchnorm|activations?|blocks?)\b"),
    S(MOD, TOPIC, 2, "weight sharing / tying", r"\b(?:shar\w*|ti(?:e|ed|ing)|reus\w*)\s+(?:the\s+)?(?:same\s+)?"
      r"(?:weights|parameters|embeddings?|layers?|modules?)\b|\b(?:weight|parameter|embedding)\s+(?:sharing|tying)\b"),
    S(MOD, TOPIC, 2, "learnable parameters", r"\blearnable\s+param\w*|\btrainable\s+param\w*|"
      r"\bforward\s*/\s*backward\s+pass\s+design\b"),
    S(MOD, CONTEXT, 1, "model implementation", r"\b(?:implement\w*|build\w*|port\w*)\b[^.?!\n]{0,40}\b"
      r"(?:resnet|transformer|u-?net|architecture|layers?|blocks?)\b"),
    # ---- custom autograd ----------------------------------------------------------------------
    S(AG, TOPIC, 3, "torch.autograd.Function", r"\b(?:torch\.)?autograd\.function\b|\bcustom\s+autograd\b|"
      r"\bautograd\s+function\b|\bsave_for_backward\b|\bctx\.\w+|\bgradgradcheck\b|\bgradcheck\b|"
      r"\bdouble\s+backward\b|\bonce_differentiable\b"),
    S(AG, TOPIC, 3, "custom backward / gradient", r"\bcustom\s+(?:\w+\s+)?(?:backwards?|gradients?|grads?|"
      r"derivatives?)\b|\b(?:efficient|faster|manual|own|surrogate)\s+(?:\w+\s+)?(?:backwards?|gradients?)\b|"
      r"\b(?:implement\w*|writ\w*|defin\w*)\b[^.?!\n]{0,40}\b(?:backwards?|gradients?|derivatives?)\b"
      r"(?!\s+(?:accumulation|clipping|clip|checkpoint\w*|descent|penalty|norm\w*|scal\w*|flow))"),
    S(AG, TOPIC, 3, "custom op / kernel", r"\bcustom\s+(?:cuda\s+|triton\s+|c\+\+\s+|fused\s+)?(?:kernels?|ops?|"
      r"operations?|operators?|extensions?)\b|\btriton\b|\bcpp_extension\b|\b(?:c\+\+|cuda)\s+extensions?\b|"
      r"\btorch\.library\b"),
    S(AG, TOPIC, 3, "non-differentiable operation", r"\bnon-?differentiable\b|\bnot\s+differentiable\b|"
      r"\bdifferentiabl\w*|"
      r"\bstraight[\s-]*through\b|\bsurrogate\s+gradient\b|\bno\s+gradient\b"),
)
