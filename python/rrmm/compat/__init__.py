"""Drop-in sleep APIs of inference and RL engines, over rrmm's tagged expandable pools.

- :mod:`rrmm.compat.torch_memory_saver`: torch_memory_saver 0.0.10's calls, properties and
  environment variables (``region``, ``cuda_graph``, ``disable``, ``pause``, ``resume``,
  ``retain_cpu_backup``, ``get_cpu_backup``, CPU and disk backups, ``TMS_INIT_ENABLE``), used by
  SGLang, slime and others.
- :mod:`rrmm.compat.vllm_cumem`: vLLM's ``CuMemAllocator`` (``get_instance``,
  ``use_memory_pool``, ``cudagraph_pool``, ``sleep``, ``discard``, ``wake_up``,
  ``get_current_usage``, ``release_pools``), call for call with vLLM 0.33.
- :mod:`rrmm.compat.vllm_sleep_mode`: vLLM's sleep-mode backend ``rrmm`` (levels 1 and 2, tags,
  the state ``RUNNING``/``SUSPENDED``/``RESUMING``, capability flags) over that allocator's
  pools, registered with vLLM by the wheel's ``vllm.general_plugins`` entry point
  (:mod:`rrmm.compat.vllm_plugin`).

The engines' APIs keep each tag's memory in an expandable pool of its own (``rrmm.mr.TaggedMemoryResource``):
a pause or sleep gives a tag's physical memory back and keeps every address (tensors and CUDA
graphs stay valid); the backup goes through the process's host page supply
(``rrmm.host_pages``), so every pause after the first copies at the link's speed.

Importable under the original names with a switch, as ``RRMM_AS_RMM=1`` does for RMM:
``RRMM_AS_TORCH_MEMORY_SAVER=1`` makes ``import torch_memory_saver`` give
:mod:`rrmm.compat.torch_memory_saver`; ``RRMM_AS_VLLM_CUMEM=1`` makes
``vllm.device_allocator.cumem`` give :mod:`rrmm.compat.vllm_cumem` (so vLLM's workers allocate
from rrmm: the backend ``rrmm`` needs it).
"""
