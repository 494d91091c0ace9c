/*
 * The graph executor factory (rt_graph_factory.c) and the executor it creates (rt_graph.c).
 */
#ifndef KILN_RT_GRAPH_H_
#define KILN_RT_GRAPH_H_

#include "rt_internal.h"

typedef struct {
  KilnModule base;
  char* graph_json;
  size_t graph_len;
  uint8_t* params; /* the factory's params as a params blob (docs/formats.md §5), for LoadParams */
  TVMByteArray params_bytes; /* the same, returned by get_graph_params */
  size_t params_len;
  char** param_names;
  size_t num_params;
  char* module_name;
} KilnFactory;

/* A new executor module over the factory's graph, params loaded (one reference). */
int kiln_ge_create(KilnFactory* fac, KilnModule** out);

#endif /* KILN_RT_GRAPH_H_ */
