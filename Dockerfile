# One image for every quotasched process (scheduler, projector, executor, CLI); compose.yaml
# picks the command.  The dependencies are the exact pins of pyproject.toml.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY quotasched ./quotasched
COPY events ./events
COPY services ./services
COPY projections ./projections
COPY examples ./examples
# The sagemaker and gpu extras too: the executor image may run `--kind sagemaker` or be a GPU
# host's `quotasched agent`.
RUN pip install --no-cache-dir ".[sagemaker,gpu]" \
    && useradd --system --uid 10001 --no-create-home quotasched \
    && mkdir -p /projections /executor && chown quotasched /projections /executor
# Not root; a named volume mounted on /projections takes this directory's owner.
USER quotasched
ENTRYPOINT ["quotasched"]
CMD ["--help"]
