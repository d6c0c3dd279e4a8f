"""What a crash needs explained: the devices of the tensors in the crashing frame, and the anomaly-mode
re-run that names the forward op of an in-place modification."""
