"""The process: the Starlette app and its routes, how uvicorn serves it (HTTP and WebSocket connections with
deadlines), the parts built once from the config, and the heap's settings."""
