"""OpenAI's Realtime API over WebSocket (`GET /v1/realtime`): docs/http.md, section Realtime."""
