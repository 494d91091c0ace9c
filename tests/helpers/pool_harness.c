/* Packed functions that drive the support code's thread pool directly (TVMBackendParallelLaunch,
 * TVMBackendParallelBarrier) for tests/backend/runtime/test_thread_pool.py. */
#include <kiln/c_runtime_api.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#define EXPORT __attribute__((visibility("default")))
#define MAXT 64
#define ARG_DATA(i) ((int64_t*)((DLTensor*)args[(i)].v_handle)->data)

static int64_t tid(void) { return (int64_t)syscall(SYS_gettid); }

static int32_t ret_int(TVMValue* ret, int32_t* ret_code, int64_t v) {
  ret->v_int64 = v;
  *ret_code = kTVMArgInt;
  return 0;
}

typedef struct {
  int64_t tids[MAXT];
  int32_t hits[MAXT];
  int num_task;
  int wait_all; /* task 0 waits (up to 100 ms) for the others to start */
} Ids;

static int64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int ids_task(int task_id, TVMParallelGroupEnv* penv, void* cdata) {
  Ids* ids = (Ids*)cdata;
  ids->tids[task_id] = tid();
  __atomic_fetch_add(&ids->hits[task_id], 1, __ATOMIC_SEQ_CST);
  if (task_id != 0) return 0;
  ids->num_task = penv->num_task;
  /* Else the caller, done with its own task, may run a worker's task that has not started
   * (the pool does that instead of waiting for a descheduled worker). */
  int64_t start = now_us();
  for (int t = 1; ids->wait_all && t < penv->num_task; ++t)
    while (__atomic_load_n(&ids->hits[t], __ATOMIC_SEQ_CST) == 0 && now_us() - start < 100000)
      sched_yield();
  return 0;
}

/* pool_tids(out int64[1 + MAXT], num_task): out[0] = the caller's thread id, out[1 + t] = the
 * thread id of task t (0: no such task); returns the launch's num_task. */
EXPORT int32_t pool_tids(TVMValue* args, int32_t* codes, int32_t n, TVMValue* ret,
                         int32_t* ret_code, void* h) {
  Ids ids;
  memset(&ids, 0, sizeof ids);
  ids.wait_all = 1;
  if (TVMBackendParallelLaunch(ids_task, &ids, (int)args[1].v_int64) != 0) return -1;
  int64_t* out = ARG_DATA(0);
  out[0] = tid();
  for (int t = 0; t < MAXT; ++t) out[1 + t] = ids.tids[t];
  return ret_int(ret, ret_code, ids.num_task);
}

/* pool_stress(launches): launches with num_task 0, 1, ..., 5 in turn; returns how many had a
 * task in [0, num_task) that did not run exactly once, or a task outside that ran. */
EXPORT int32_t pool_stress(TVMValue* args, int32_t* codes, int32_t n, TVMValue* ret,
                           int32_t* ret_code, void* h) {
  int64_t bad = 0;
  for (int64_t i = 0; i < args[0].v_int64; ++i) {
    Ids ids;
    memset(&ids, 0, sizeof ids);
    if (TVMBackendParallelLaunch(ids_task, &ids, (int)(i % 6)) != 0) return -1;
    for (int t = 0; t < MAXT; ++t) {
      if (ids.hits[t] != (t < ids.num_task)) {
        ++bad;
        break;
      }
    }
  }
  return ret_int(ret, ret_code, bad);
}

typedef struct {
  int64_t round[MAXT];
  int64_t bad;
} Rounds;

/* Each round: publish the round number, barrier, check every task published it, barrier. */
static int barrier_task(int task_id, TVMParallelGroupEnv* penv, void* cdata) {
  Rounds* r = (Rounds*)cdata;
  for (int64_t k = 1; k <= 300; ++k) {
    __atomic_store_n(&r->round[task_id], k, __ATOMIC_RELAXED);
    TVMBackendParallelBarrier(task_id, penv);
    for (int t = 0; t < penv->num_task; ++t)
      if (__atomic_load_n(&r->round[t], __ATOMIC_RELAXED) != k)
        __atomic_fetch_add(&r->bad, 1, __ATOMIC_RELAXED);
    TVMBackendParallelBarrier(task_id, penv);
  }
  return 0;
}

/* pool_barrier(): the number of tasks that saw another task a round behind after a barrier. */
EXPORT int32_t pool_barrier(TVMValue* args, int32_t* codes, int32_t n, TVMValue* ret,
                            int32_t* ret_code, void* h) {
  Rounds r;
  memset(&r, 0, sizeof r);
  if (TVMBackendParallelLaunch(barrier_task, &r, 0) != 0) return -1;
  return ret_int(ret, ret_code, r.bad);
}

typedef struct {
  int64_t outer_tid, inner_tid, inner_num_task, inner_calls;
} Nest;

static int inner_task(int task_id, TVMParallelGroupEnv* penv, void* cdata) {
  Nest* nest = (Nest*)cdata;
  nest->inner_tid = tid();
  nest->inner_num_task = penv->num_task;
  nest->inner_calls += 1;
  return 0;
}

static int outer_task(int task_id, TVMParallelGroupEnv* penv, void* cdata) {
  Nest* nest = (Nest*)cdata + task_id;
  nest->outer_tid = tid();
  return TVMBackendParallelLaunch(inner_task, nest, 0);
}

/* pool_nested(out int64[4 * MAXT]): per outer task, its thread, the inner launch's thread,
 * num_task and number of calls; returns the outer launch's num_task. */
EXPORT int32_t pool_nested(TVMValue* args, int32_t* codes, int32_t n, TVMValue* ret,
                           int32_t* ret_code, void* h) {
  Nest* nest = (Nest*)ARG_DATA(0);
  memset(nest, 0, sizeof(Nest) * MAXT);
  if (TVMBackendParallelLaunch(outer_task, nest, 0) != 0) return -1;
  int64_t num_task = 0;
  while (num_task < MAXT && nest[num_task].outer_tid != 0) ++num_task;
  return ret_int(ret, ret_code, num_task);
}

static int fail_task(int task_id, TVMParallelGroupEnv* penv, void* cdata) {
  if (task_id < *(int*)cdata) return 0;
  char msg[64];
  snprintf(msg, sizeof msg, "pool test: task %d of %d failed", task_id, penv->num_task);
  TVMAPISetLastError(msg);
  return -1;
}

/* pool_fail(first): tasks >= first fail; the launch's error becomes this call's. */
EXPORT int32_t pool_fail(TVMValue* args, int32_t* codes, int32_t n, TVMValue* ret,
                         int32_t* ret_code, void* h) {
  int first = (int)args[0].v_int64;
  if (TVMBackendParallelLaunch(fail_task, &first, 0) != 0) return -1;
  return ret_int(ret, ret_code, 0);
}

/* pool_fork(): with the pool's workers running, fork; the child launches on a fresh pool
 * (an alarm kills it if that hangs) and exits 0 when every task ran once. Returns the child's
 * exit status (128 + signal when killed). */
EXPORT int32_t pool_fork(TVMValue* args, int32_t* codes, int32_t n, TVMValue* ret,
                         int32_t* ret_code, void* h) {
  Ids ids;
  memset(&ids, 0, sizeof ids);
  if (TVMBackendParallelLaunch(ids_task, &ids, 0) != 0) return -1;
  int team = ids.num_task;
  pid_t pid = fork();
  if (pid == 0) {
    alarm(20);
    memset(&ids, 0, sizeof ids);
    int ok = TVMBackendParallelLaunch(ids_task, &ids, 0) == 0 && ids.num_task == team;
    for (int t = 0; t < team; ++t) ok = ok && ids.hits[t] == 1;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return ret_int(ret, ret_code, -1);
  return ret_int(ret, ret_code, WIFEXITED(status) ? WEXITSTATUS(status)
                                                  : 128 + WTERMSIG(status));
}

typedef struct {
  int started, released, other_num_task;
} Concurrent;

static int hold_task(int task_id, TVMParallelGroupEnv* penv, void* cdata) {
  Concurrent* c = (Concurrent*)cdata;
  if (task_id != 0) return 0;
  __atomic_store_n(&c->started, 1, __ATOMIC_SEQ_CST);
  int64_t start = now_us();
  while (!__atomic_load_n(&c->released, __ATOMIC_SEQ_CST) && now_us() - start < 10000000)
    sched_yield();
  return 0;
}

static int probe_task(int task_id, TVMParallelGroupEnv* penv, void* cdata) {
  if (task_id == 0) ((Concurrent*)cdata)->other_num_task = penv->num_task;
  return 0;
}

static void* other_launcher(void* arg) {
  Concurrent* c = (Concurrent*)arg;
  while (!__atomic_load_n(&c->started, __ATOMIC_SEQ_CST)) sched_yield();
  TVMBackendParallelLaunch(probe_task, c, 0);
  __atomic_store_n(&c->released, 1, __ATOMIC_SEQ_CST);
  return NULL;
}

/* pool_concurrent(): while this thread's launch holds the pool, another thread launches; returns
 * that launch's num_task (1: it ran serially instead of waiting). */
EXPORT int32_t pool_concurrent(TVMValue* args, int32_t* codes, int32_t n, TVMValue* ret,
                               int32_t* ret_code, void* h) {
  Concurrent c;
  memset(&c, 0, sizeof c);
  pthread_t other;
  if (pthread_create(&other, NULL, other_launcher, &c) != 0) return -1;
  int rc = TVMBackendParallelLaunch(hold_task, &c, 0);
  pthread_join(other, NULL);
  if (rc != 0) return -1;
  return ret_int(ret, ret_code, c.other_num_task);
}
