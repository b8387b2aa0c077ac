"""Serving: the HTTP API (`http_api`), engine replicas on Ray Serve (`ray_replicas`) and remote
engines (`remote`). Nothing here imports gradio; the app mounts the API's routes on its server."""
