"""The control plane: the coordinator (`coordinator`) and its parts (`requests`: the request
table, `supervisor`: deaths, hangs and restarts, `wiring`: which links are open, `links`:
non-blocking sends to stages and clients), stage processes (`stage_handle`, `procutil`),
endpoint names (`endpoints`), placement on a Ray cluster (`ray_placement`, `ray_local`) and a
pipeline run inside the calling process (`embedded`)."""
