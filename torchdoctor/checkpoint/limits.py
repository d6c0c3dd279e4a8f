"""The names and size limits every checkpoint reader shares (data only: no imports).

The readers (``detect``, ``torch_zip``, ``torch_legacy``, ``dcp``, ``folders``, ``layout``) read
their bounds from here, below all of them, instead of from the dispatcher that calls them.
"""

CKPT_EXT = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".tar", ".pkl", ".pickle", ".model")
HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin")
TRAINER_FILES = ("optimizer.pt", "optimizer.bin", "scheduler.pt", "scheduler.bin", "scaler.pt", "sampler.bin",
                 "trainer_state.json", "training_args.bin", "rng_state.pth", "random_states_0.pkl")

MAX_PICKLE = 64 << 20  # a pickle read into memory (data.pkl, plain pickle, DCP .metadata): larger is refused
MAX_SNIFF_PICKLE = 8 << 20  # protocol 0/1 pickles (no PROTO opcode) are recognised up to this size
MAX_JSON = 16 << 20  # shard indexes, trainer_state.json
PARTIAL_SCAN = 8 << 20  # of an oversized plain pickle, this much is still scanned for globals
MAX_FILES = 512  # files of one folder or shards of one index that are read
