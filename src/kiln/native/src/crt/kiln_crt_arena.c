/* The arena of kiln_crt_graph.h: a bump allocator over caller memory, no heap. */
#include "kiln_crt_graph.h"

static size_t kiln_align_up(size_t n) {
  return (n + KILN_CRT_ALIGN - 1) & ~(size_t)(KILN_CRT_ALIGN - 1);
}

void KilnArena_Init(KilnArena* arena, void* base, size_t size) {
  /* Start at the first aligned byte so every block is aligned whatever `base` is. */
  uintptr_t start = (uintptr_t)base;
  uintptr_t aligned = (start + KILN_CRT_ALIGN - 1) & ~(uintptr_t)(KILN_CRT_ALIGN - 1);
  size_t skip = (size_t)(aligned - start);
  arena->base = (uint8_t*)aligned;
  arena->size = size > skip ? size - skip : 0;
  arena->used = 0;
  arena->needed = 0;
}

void* KilnArena_Alloc(KilnArena* arena, size_t nbytes) {
  size_t need = kiln_align_up(nbytes == 0 ? 1 : nbytes);
  void* ptr;
  if (need < nbytes || arena->size - arena->used < need) {
    arena->needed = need < nbytes || arena->used > (size_t)-1 - need ? (size_t)-1
                                                                        : arena->used + need;
    TVMAPISetLastError("KilnArena_Alloc: the arena is too small");
    return NULL;
  }
  ptr = arena->base + arena->used;
  arena->used += need;
  return ptr;
}
