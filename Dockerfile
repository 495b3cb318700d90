# The demo trainer of docker-compose.yml: `rl-otel demo` serving Prometheus metrics on :9464.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml requirements-test.txt README.md ./
COPY rl_otel ./rl_otel
# CPU wheels of torch (the pin in requirements-test.txt matches 2.13.0+cpu); `otlp`: the phase spans the compose
# trainer pushes to the Collector (OTEL_TRACES_EXPORTER=otlp).
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu \
        -c requirements-test.txt -e '.[torch,tensorboard,otlp]'
ENV RL_OTEL_RUN=compose-demo
EXPOSE 9464
CMD ["rl-otel", "demo", "--host", "0.0.0.0", "--port", "9464", "--repeat", "0", "--linger", "240"]
