"""Kiln's runtime: what a deployed model needs, and nothing of the compiler.

Design note. This package mirrors Apache TVM's classic runtime: a tree of :class:`Module`
objects (C source or a loaded library holding kernels; a binary-serializable
``GraphExecutorFactory`` holding graph JSON and params) that ``export_library`` turns into one
shared object (or a relocatable object, or a tar to relink: ``cc``, ``tar``) with the imports
blob ``__tvm_dev_mblob``, and ``load_module`` turns back into the tree. User module types
subclass :class:`BinaryModule` and ``register_module_loader``; external modules that need
constants get them through a ``ConstLoaderModule`` (``create_metadata_module``); the BYOC
``kiln_json`` backend's functions load as ``JSONRuntimeModule`` (``json_runtime``, kernels in
``json_kernels``). Models with symbolic shapes ship a ``VMExecutable`` (``vm_executable``: the
bytecode and its byte format ``vm_format``/``vm_bytecode``) run by the VM module (``vm``, with
``vm_builtins``, ``vm_storage``, ``vm_inputs``, ``vm_replay``, ``vm_profile``, and
``vm_dynamic_ops`` over ``dynamic_ops``: the ops whose output shape depends on data). Compiled
kernels arrive as C source (``CSourceModule``) or as LLVM objects (``ObjectModule``, type_key
``llvm``), or as C source compiled where the model runs (``SourceDeviceModule``, type_key
``kiln_jit``, the ``jit`` target: compiler and flags in ``device_toolchain``, foreign ISAs run
in ``device_server``). Kernels use the
packed C ABI of ``include/kiln/c_runtime_api.h``; tensors cross it
as DLPack ``DLTensor`` structs of :class:`NDArray` objects. Byte formats: shared reference
``runtime-formats.md``. Files: one concept each (``ndarray``, ``packed_func``, ``module``,
``blob``, ``params``, ``graph_storage``, ``graph_executor``, ``debug_executor``...).

Layering: ``kiln.runtime`` imports only the standard library, numpy and ``kiln.errors`` — never
the compiler packages (``kiln.ir``, ``kiln.frontend``, ``kiln.passes``, ``kiln.topi``,
``kiln.codegen``) nor onnx — so a deployment needs only this package.
"""

from kiln.runtime.binary_module import BinaryModule, list_module_loaders, register_module_loader
from kiln.runtime.toolchain.cc import create_object, create_shared, cross_compiler
from kiln.runtime.const_loader_module import ConstLoaderModule, create_metadata_module
from kiln.runtime.graph_executor.debug import GraphExecutorDebug
from kiln.runtime.jit.device_module import SourceDeviceModule
from kiln.runtime.dlpack import from_dlpack
from kiln.runtime.export import export_library
from kiln.runtime.graph_executor.executor import GraphExecutor
from kiln.runtime.graph_executor.factory import GraphExecutorFactoryModule
from kiln.runtime.contrib.json.json_kernels import register_json_kernel
from kiln.runtime.contrib.json.json_runtime import JSONRuntimeModule
from kiln.runtime.library_module import LibraryModule
from kiln.runtime.load import load_module
from kiln.runtime.module import Module, PyFunctionModule
from kiln.runtime.ndarray import Device, NDArray, array, cpu, empty
from kiln.runtime.object_module import ObjectModule
from kiln.runtime.packed_func import PackedFunc
from kiln.runtime.params import load_param_dict, save_param_dict
from kiln.runtime.registry import get_global_func, list_global_func_names, register_func
from kiln.runtime.source_module import CSourceModule
from kiln.runtime.vm.executable import VMExecutable

__all__ = [
    "BinaryModule", "CSourceModule", "ConstLoaderModule", "Device", "GraphExecutor",
    "GraphExecutorDebug", "GraphExecutorFactoryModule", "JSONRuntimeModule", "LibraryModule",
    "Module", "NDArray",
    "ObjectModule", "PackedFunc", "PyFunctionModule", "SourceDeviceModule", "VMExecutable", "array", "cpu", "create_metadata_module",
    "create_object", "create_shared", "cross_compiler", "empty", "export_library", "from_dlpack",
    "get_global_func", "list_global_func_names", "list_module_loaders", "load_module",
    "load_param_dict", "register_func", "register_json_kernel", "register_module_loader",
    "save_param_dict",
]
