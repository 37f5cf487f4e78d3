# taskstream services for docker-compose (production-like): no embedded services inside the image.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY taskstream taskstream
COPY streams streams
COPY schemas schemas
COPY projections projections
COPY connectors connectors
RUN pip install --no-cache-dir . && useradd --system --home /var/lib/taskstream taskstream \
    && mkdir -p /var/lib/taskstream && chown taskstream /var/lib/taskstream
USER taskstream
ENV TASKSTREAM_STATE_DIR=/var/lib/taskstream
ENTRYPOINT ["taskstream"]
