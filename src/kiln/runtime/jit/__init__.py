"""The ``jit`` target's source-embedded device (docs/decisions/007-source-embedded-device.md).

``device_module`` (``SourceDeviceModule``, type_key ``kiln_jit``) carries kernels as C source
and compiles them where the model runs, with the compiler and flags of ``device_toolchain``
(``$KILN_DEVICE_CC``); kernels for a foreign ISA run in another process through
``device_server`` (the protocol: docs/formats.md).
"""
