"""Training-loop watches: gradient bookkeeping, settings that silently change training (eval mode,
float16 without a scaler, broadcasting losses), and the script's custom autograd Functions."""
