"""The control plane: the coordinator (`coordinator`), stage process supervision
(`stage_handle`, `procutil`) and the run's endpoint names (`endpoints`)."""
