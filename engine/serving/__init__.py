"""The serving floor: many requests over time.

The job queue and its GPU worker (`queue`), the registered models (`registry`), batch files (`batch`), time
estimates (`estimates`), the HTTP API (`http_api`), engine replicas on Ray Serve (`ray_replicas`) and remote
engines (`remote`). The typed events a job sends are `engine.events`. Imports the floors below; nothing here
imports gradio (the app mounts the API's routes on its server).
"""
