"""The data plane's wire: message types and codec (`payload`), tensor header checks
(`tensor_codec`), the same-host shared-memory pool (`shm_pool`) and ZMQ links (`transport`)."""
