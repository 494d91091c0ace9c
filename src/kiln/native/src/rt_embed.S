/* The files the jit device compiles with its kernels, embedded in libkiln_runtime (the
   Makefile passes their paths): the backend support (src/support/backend.c, also part
   of the cache key) and the C ABI header it and the kernels include. */
  .section .rodata
  .global kiln_embedded_backend_c
  .hidden kiln_embedded_backend_c
kiln_embedded_backend_c:
  .incbin KILN_BACKEND_C_PATH
  .global kiln_embedded_backend_c_end
  .hidden kiln_embedded_backend_c_end
kiln_embedded_backend_c_end:
  .byte 0
  .global kiln_embedded_api_h
  .hidden kiln_embedded_api_h
kiln_embedded_api_h:
  .incbin KILN_API_H_PATH
  .global kiln_embedded_api_h_end
  .hidden kiln_embedded_api_h_end
kiln_embedded_api_h_end:
  .byte 0
  .section .note.GNU-stack,"",%progbits
