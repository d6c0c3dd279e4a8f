"""Memory measurement building blocks for the ``memory`` probe (issue 5).

Measurement only, no judgment: counters (host heap, CUDA allocator), the saved-tensor
(activation) counter, tensor accounting of parameters / gradients / optimizer state,
allocation-site attribution, OOM parsing, and the trend fit the rules use.
The instruments in ``torchdoctor/instruments/memory/`` glue these into a run;
the rules in ``torchdoctor/rules/memory.py`` judge the evidence they write.
Every private torch API used here is wrapped in :mod:`torchdoctor.memory.cuda`.
"""
