"""The device model every layer shares, and the names components agree on.

What a GPU node is made of (``inventory``) and how a user writes one down (``spec``: the
NodeProfile format), how each GPU is shared (``sharing``), the names pods, nodes and components
depend on (``contracts``), the extender-to-agent handoff recorded on a pod (``assignment``), which
gang a pod belongs to (``gangs``), naming a GPU in configuration (``gpu_keys``), the one error tree
(``errors``) and state files written atomically (``state_file``). Pure values and parsing; the
bottom layer, importing no other gpuweave package (docs/architecture.md).
"""
