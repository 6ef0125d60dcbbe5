"""The control plane: the coordinator (`coordinator`) and its parts (`requests`: the request
table, `supervisor`: deaths, hangs and restarts, `wiring`: which links are open, `links`:
non-blocking sends to stages and clients), stage processes (`stage_handle`: one `Incarnation`
per run), endpoint names (`endpoints`), placement on a Ray cluster (`ray_placement`,
`ray_local`) and a pipeline run inside the calling process (`embedded`). Process lifetime
helpers shared with the stage process live in `omni_mp.utils.procs`, socket depths in
`omni_mp.wire.transport`: a stage process imports nothing from here."""
