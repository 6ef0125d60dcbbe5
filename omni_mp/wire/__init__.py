"""The data plane's wire: message types (`messages`), their codec (`codec`), tensor header
checks, limits and numpy arrays (`tensor_codec`), torch tensors (`torch_tensors`, never
imported by a client), the same-host shared-memory pool (`shm_pool`) and ZMQ links
(`transport`)."""
