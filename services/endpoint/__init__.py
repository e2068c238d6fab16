"""AWS Batch's `rest-json` protocol over HTTP, for the quota-management operations: the real
`aws batch ... --endpoint-url` and `boto3.client("batch", endpoint_url=...)` work unchanged.

`model` reads botocore's own service model (routes, validation, output shapes); `operations`
turns each request into the same NATS command or read-API question every other path uses;
`server` is the aiohttp application `quotasched up` starts (loopback only).
"""
