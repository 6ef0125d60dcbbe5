"""The pipeline config: `schema` (the YAML keys as typed Structs) and `validate` (checks,
registry names, loading a file). Import from the submodule you need; this package imports neither."""
