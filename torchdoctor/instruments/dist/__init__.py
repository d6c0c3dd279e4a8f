"""Ranked runs (``--nproc-per-node``; inert otherwise): the collective recorder, the samplers' facts and
each rank's step arrivals."""
