# gpuweave: node agent, scheduler extender and CLI in one image (manifests/ runs it with
# different arguments). The image carries no NVIDIA library: the node agent uses the host driver's
# libnvidia-ml.so.1 and nvidia-smi, which the NVIDIA container runtime injects only into a
# container that asks for them (manifests/node-agent-daemonset.yaml: runtimeClassName nvidia,
# NVIDIA_VISIBLE_DEVICES=all, NVIDIA_DRIVER_CAPABILITIES=utility). The image itself sets neither
# variable, so where nvidia is the default runtime the extender's pods still see no GPU.
# `gpuweave node-agent` checks all of it at start and names what is missing in one line.
FROM python:3.11-slim

WORKDIR /src
COPY pyproject.toml README.md ./
COPY devicemodel/ devicemodel/
COPY topology/ topology/
COPY kubeio/ kubeio/
COPY netio/ netio/
COPY devicekinds/ devicekinds/
COPY hardware/ hardware/
COPY mig/ mig/
COPY health/ health/
COPY nodeagent/ nodeagent/
COPY deviceplugin/ deviceplugin/
COPY dradriver/ dradriver/
COPY scheduler_ext/ scheduler_ext/
COPY gpuweave/ gpuweave/
COPY proto/ proto/
RUN pip install --no-cache-dir . && rm -rf /src

WORKDIR /
# The extender runs as this user (manifests/extender.yaml); the node agent runs privileged.
RUN useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin gpuweave
ENTRYPOINT ["gpuweave"]
CMD ["--help"]
