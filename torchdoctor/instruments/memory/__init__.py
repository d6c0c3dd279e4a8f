"""Memory: the per-step sampler (every step, cheap), the memory probe's costlier detail, and forwards
that build a graph nobody backpropagates (grad-in-eval)."""
