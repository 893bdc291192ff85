# gpuweave: node agent, scheduler extender and CLI in one image (manifests/ runs it with
# different arguments). The node agent loads libnvidia-ml.so from the host's driver, which the
# NVIDIA container toolkit mounts into privileged GPU pods.
FROM python:3.11-slim

WORKDIR /src
COPY pyproject.toml README.md ./
COPY topology/ topology/
COPY hardware/ hardware/
COPY mig/ mig/
COPY health/ health/
COPY deviceplugin/ deviceplugin/
COPY scheduler_ext/ scheduler_ext/
COPY gpuweave/ gpuweave/
COPY proto/ proto/
RUN pip install --no-cache-dir . && rm -rf /src

WORKDIR /
# The extender runs as this user (manifests/extender.yaml); the node agent runs privileged.
RUN useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin gpuweave
ENTRYPOINT ["gpuweave"]
CMD ["--help"]
