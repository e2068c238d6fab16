"""The NATS plumbing every service shares, on the lowest floor of the shell.

`bus` connects (with the process's credentials) and declares the streams, buckets and object
store; `log` reads the command and fact logs in order (whole, in chunks, or message by
message); `credentials` turns the QUOTASCHED_NATS_* environment into connect options;
`embedded` starts a nats-server of our own (`up`, tests); `natsfix` mends what nats-py gets
wrong here.  Nothing here imports the scheduler, the configuration or any other service.
"""
