"""Configuration as code, and the NATS roles derived from it.

`file` reads and checks a configuration file (YAML) into its parts; `aspects` compares one
part of it with what the log holds; `plan` turns the difference into commands; `render`
prints a plan; `as_code` is the whole (`load`, `plan_against`, `apply`), what
`quotasched config` and `auth generate` use; `auth` derives the NATS users, permissions and
credentials files of each role from a configuration.  Nothing here imports a service: the
scheduler, executors and CLI import from here.
"""
