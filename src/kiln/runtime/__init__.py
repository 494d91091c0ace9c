"""Kiln's runtime: what a deployed model needs, and nothing of the compiler.

Design note. This package mirrors Apache TVM's classic runtime: a tree of :class:`Module`
objects (C source or a loaded library holding kernels; a binary-serializable executor factory
holding graph JSON and params, or a VM executable) that ``export_library`` turns into one
shared object (or a relocatable object, or a tar to relink) with the imports blob
``__tvm_dev_mblob``, and ``load_module`` turns back into the tree. Byte formats and ABIs:
docs/formats.md. User module types subclass :class:`BinaryModule` and
``register_module_loader``; external modules that need constants get them through a
``ConstLoaderModule`` (``create_metadata_module``). Kernels use the packed C ABI of
``kiln/native/include/kiln/c_runtime_api.h``; tensors cross it as DLPack ``DLTensor`` structs
of :class:`NDArray` objects.

The core is flat, one concept per file: ``ndarray``, ``dlpack``, ``packed_func``,
``registry``, ``module`` and the module types (``library_module``, ``object_module``,
``source_module``, ``binary_module``, ``const_loader_module``), ``blob``, ``stream``,
``params``, ``export``, ``load``, ``elf``, ``c_types``, ``threads``, ``dynamic_ops`` (numpy
definitions of the ops whose output shape depends on data). One folder per executor or
service:

- ``graph_executor/``: the graph executor, its factory module, graph JSON, planned storage,
  batched C calls and the debug executor;
- ``vm/``: the VM (``virtual_machine``), its executable and byte format, bytecode, builtins,
  storage, inputs, replay of traced calls and profiling (decision 014);
- ``jit/``: the ``jit`` target's source-embedded device (``device_module``), its compiler
  and flags (``device_toolchain``) and the device server for foreign ISAs (``device_server``);
- ``toolchain/``: running the system C compiler (``compiler``, ``cc``, ``tar``) and the caches
  of compiled code (``compile_cache``, ``cc_manifest``, ``cache_limit``, ``private_dir``);
- ``contrib/json/``: the BYOC ``kiln_json`` runtime module and its kernels.

Layering: the standard library, numpy, ``kiln.errors`` and the C sources' paths in
``kiln.native`` — never the compiler packages nor onnx — so a deployment needs only this
package.

May import: kiln.native (and kiln.errors).
"""

from kiln.runtime.binary_module import BinaryModule, list_module_loaders, register_module_loader
from kiln.runtime.const_loader_module import ConstLoaderModule, create_metadata_module
from kiln.runtime.contrib.json.json_kernels import register_json_kernel
from kiln.runtime.contrib.json.json_runtime import JSONRuntimeModule
from kiln.runtime.dlpack import from_dlpack
from kiln.runtime.export import export_library
from kiln.runtime.graph_executor.debug import GraphExecutorDebug
from kiln.runtime.graph_executor.executor import GraphExecutor
from kiln.runtime.graph_executor.factory import GraphExecutorFactoryModule
from kiln.runtime.jit.device_module import SourceDeviceModule
from kiln.runtime.library_module import LibraryModule
from kiln.runtime.load import load_module
from kiln.runtime.module import Module, PyFunctionModule
from kiln.runtime.ndarray import Device, NDArray, array, cpu, empty
from kiln.runtime.object_module import ObjectModule
from kiln.runtime.packed_func import PackedFunc
from kiln.runtime.params import load_param_dict, save_param_dict
from kiln.runtime.registry import get_global_func, list_global_func_names, register_func
from kiln.runtime.source_module import CSourceModule
from kiln.runtime.toolchain.cc import create_object, create_shared, cross_compiler
from kiln.runtime.vm.executable import VMExecutable

__all__ = [
    "BinaryModule", "CSourceModule", "ConstLoaderModule", "Device", "GraphExecutor",
    "GraphExecutorDebug", "GraphExecutorFactoryModule", "JSONRuntimeModule", "LibraryModule",
    "Module", "NDArray",
    "ObjectModule", "PackedFunc", "PyFunctionModule", "SourceDeviceModule", "VMExecutable",
    "array", "cpu", "create_metadata_module",
    "create_object", "create_shared", "cross_compiler", "empty", "export_library", "from_dlpack",
    "get_global_func", "list_global_func_names", "list_module_loaders", "load_module",
    "load_param_dict", "register_func", "register_json_kernel", "register_module_loader",
    "save_param_dict",
]
