# One image for every quotasched process (scheduler, executor, CLI); compose picks the command.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY events ./events
COPY services ./services
COPY projections ./projections
COPY examples ./examples
RUN pip install --no-cache-dir .
ENTRYPOINT ["quotasched"]
CMD ["--help"]
