/* A fake NVML for tests: built as libnvidia-ml.so.1 in the build tree, it exports the NVML
 * functions the launcher uses with NVML's ABI, so the launcher's GPU paths run on machines
 * without a driver. Point the launcher at it by path (Nvml::load), or put its directory first
 * on LD_LIBRARY_PATH for a `launch` started by a test.
 *
 * The GPUs and their figures come from the text file named by FAKE_NVML_CONFIG (test code,
 * so reading the environment here is fine), read again on every call: a test may change the
 * figures while a launcher runs. Replace the file atomically (write another, rename it), or a
 * call may read it half-written. One setting a line; `#` starts a comment:
 *
 *   init_error 9                    nvmlInit_v2 fails with this NVML error (9: driver not loaded)
 *   driver_version 550.54.15
 *   cuda_driver_version 12040       the CUDA version the driver supports (12.4)
 *   device_count 2                  default: one more than the highest gpuN below
 *   gpu0.name NVIDIA H100 80GB HBM3
 *   gpu0.uuid GPU-0f1e2d3c-...
 *   gpu0.compute_capability 9.0
 *   gpu0.memory 85520809984 1073741824          total and used bytes
 *   gpu0.utilization 87 40                      GPU and memory utilisation, percent
 *   gpu0.temperature 64                         degrees Celsius
 *   gpu0.throttle_reasons 0x4                   nvmlClocksThrottleReason* bits
 *   gpu0.ecc_volatile 2 0                       corrected and uncorrected errors
 *   gpu0.ecc_aggregate 10 1
 *   gpu0.mig 1 0                                MIG mode now, and pending
 *   gpu0.process 12345 1073741824               a compute process: pid and GPU memory bytes
 *   gpu0.process children:4242 536870912        every live child of pid 4242
 *   gpu0.process env:LOCAL_RANK=1 536870912     every live process whose environment has it
 *   gpu0.process 777 n/a                        memory not available (NVML_VALUE_NOT_AVAILABLE)
 *   gpu1.temperature error:15                   this query fails with NVML error 15 (GPU lost)
 *   gpu1.handle error:4                         nvmlDeviceGetHandleByIndex_v2 fails
 *   gpu1.process error:3                        the process query fails
 *
 * A figure the file does not give fails with NVML_ERROR_NOT_SUPPORTED, as a real driver does
 * for what a GPU lacks. Without FAKE_NVML_CONFIG, or with a file it cannot read, nvmlInit_v2
 * fails with NVML_ERROR_UNKNOWN and says why on stderr.
 *
 * Built twice: complete, and with FAKE_NVML_SPARSE, which lacks the optional functions an
 * older driver lacks (nvmlDeviceGetComputeRunningProcesses_v3,
 * nvmlSystemGetCudaDriverVersion_v2, nvmlDeviceGetMigMode) and names the throttle query by its
 * newer name only (nvmlDeviceGetCurrentClocksEventReasons), so that every fallback runs. That
 * mix is for coverage; no real driver has exactly it.
 *
 * fake_nvml_init_count() (not NVML) tells a test how many nvmlInit_v2 calls are not yet
 * matched by nvmlShutdown. */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st {
  int index;
} * nvmlDevice_t;
typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
  unsigned int gpu, memory;
} nvmlUtilization_t;
typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 16
#define MAX_PROCESS_RULES 32
#define MAX_PROCESSES 256
#define TEXT 128

/* Each figure: the NVML code its query returns (0 with the values below, NOT_SUPPORTED when
 * the file does not say). */
typedef struct {
  int rc;
  char text[TEXT];
  unsigned long long a, b;
} Figure;

typedef struct {
  enum { kPid, kChildrenOf, kEnvironment } kind;
  long pid;
  char env[TEXT];
  unsigned long long bytes;
} ProcessRule;

typedef struct {
  Figure handle, name, uuid, compute_capability, memory, utilization, temperature, throttle,
      ecc_volatile, ecc_aggregate, mig, processes;
  int nrules;
  ProcessRule rules[MAX_PROCESS_RULES];
} Gpu;

typedef struct {
  int init_error;
  Figure driver_version, cuda_driver_version;
  int device_count;
  Gpu gpus[MAX_GPUS];
} Config;

static pthread_mutex_t g_mutex = PTHREAD_MUTEX_INITIALIZER;
static int g_init_count;
static Config g_config;
static struct nvmlDevice_st g_handles[MAX_GPUS];

static void unsupported(Figure* f) { f->rc = NVML_ERROR_NOT_SUPPORTED; }

static char* trim(char* s) {
  while (isspace((unsigned char)*s)) ++s;
  char* end = s + strlen(s);
  while (end > s && isspace((unsigned char)end[-1])) *--end = '\0';
  return s;
}

/* "error:N" makes the query fail with N; otherwise the text and up to two numbers. */
static void setFigure(Figure* f, const char* value, int numbers) {
  if (strncmp(value, "error:", 6) == 0) {
    f->rc = atoi(value + 6);
    return;
  }
  f->rc = NVML_SUCCESS;
  snprintf(f->text, sizeof f->text, "%s", value);
  if (numbers >= 1) {
    char* end = NULL;
    f->a = strtoull(value, &end, 0);
    if (numbers >= 2) {
      /* "9.0" for compute capability, "87 40" elsewhere */
      while (*end == ' ' || *end == '.') ++end;
      f->b = strtoull(end, NULL, 0);
    }
  }
}

static void addProcessRule(Gpu* gpu, const char* value) {
  if (strncmp(value, "error:", 6) == 0) {
    gpu->processes.rc = atoi(value + 6);
    return;
  }
  if (gpu->nrules == MAX_PROCESS_RULES) return;
  ProcessRule* r = &gpu->rules[gpu->nrules];
  char selector[TEXT], bytes[TEXT];
  if (sscanf(value, "%127s %127s", selector, bytes) != 2) return;
  if (strncmp(selector, "children:", 9) == 0) {
    r->kind = kChildrenOf;
    r->pid = atol(selector + 9);
  } else if (strncmp(selector, "env:", 4) == 0) {
    r->kind = kEnvironment;
    snprintf(r->env, sizeof r->env, "%s", selector + 4);
  } else {
    r->kind = kPid;
    r->pid = atol(selector);
  }
  r->bytes = strcmp(bytes, "n/a") == 0 ? ~0ULL : strtoull(bytes, NULL, 0);
  gpu->nrules++;
}

/* Reads the file into g_config; 0 when it cannot (and says why). Called with g_mutex held. */
static int readConfig(void) {
  Config* c = &g_config;
  memset(c, 0, sizeof *c);
  unsupported(&c->driver_version);
  unsupported(&c->cuda_driver_version);
  for (int i = 0; i < MAX_GPUS; ++i) {
    Gpu* g = &c->gpus[i];
    Figure* figures[] = {
        &g->name,        &g->uuid,     &g->compute_capability, &g->memory,        &g->utilization,
        &g->temperature, &g->throttle, &g->ecc_volatile,       &g->ecc_aggregate, &g->mig};
    for (size_t k = 0; k < sizeof figures / sizeof *figures; ++k) unsupported(figures[k]);
  }
  c->device_count = -1;
  const char* path = getenv("FAKE_NVML_CONFIG");
  if (!path) {
    fprintf(stderr, "fake_nvml: FAKE_NVML_CONFIG is not set\n");
    return 0;
  }
  FILE* f = fopen(path, "re");
  if (!f) {
    fprintf(stderr, "fake_nvml: cannot read FAKE_NVML_CONFIG=%s\n", path);
    return 0;
  }
  int highest = -1;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    for (char* p = line; *p; ++p)
      if (*p == '#' && (p == line || isspace((unsigned char)p[-1]))) {
        *p = '\0';
        break;
      }
    char* s = trim(line);
    if (!*s) continue;
    char* value = s;
    while (*value && !isspace((unsigned char)*value)) ++value;
    if (*value) *value++ = '\0';
    value = trim(value);
    const char* key = s;
    if (strcmp(key, "init_error") == 0) {
      c->init_error = atoi(value);
    } else if (strcmp(key, "driver_version") == 0) {
      setFigure(&c->driver_version, value, 0);
    } else if (strcmp(key, "cuda_driver_version") == 0) {
      setFigure(&c->cuda_driver_version, value, 1);
    } else if (strcmp(key, "device_count") == 0) {
      c->device_count = atoi(value);
    } else if (strncmp(key, "gpu", 3) == 0 && isdigit((unsigned char)key[3])) {
      char* dot = NULL;
      long index = strtol(key + 3, &dot, 10);
      if (!dot || *dot != '.' || index < 0 || index >= MAX_GPUS) continue;
      if (index > highest) highest = (int)index;
      Gpu* g = &c->gpus[index];
      const char* field = dot + 1;
      if (strcmp(field, "handle") == 0)
        setFigure(&g->handle, value, 0);
      else if (strcmp(field, "name") == 0)
        setFigure(&g->name, value, 0);
      else if (strcmp(field, "uuid") == 0)
        setFigure(&g->uuid, value, 0);
      else if (strcmp(field, "compute_capability") == 0)
        setFigure(&g->compute_capability, value, 2);
      else if (strcmp(field, "memory") == 0)
        setFigure(&g->memory, value, 2);
      else if (strcmp(field, "utilization") == 0)
        setFigure(&g->utilization, value, 2);
      else if (strcmp(field, "temperature") == 0)
        setFigure(&g->temperature, value, 1);
      else if (strcmp(field, "throttle_reasons") == 0)
        setFigure(&g->throttle, value, 1);
      else if (strcmp(field, "ecc_volatile") == 0)
        setFigure(&g->ecc_volatile, value, 2);
      else if (strcmp(field, "ecc_aggregate") == 0)
        setFigure(&g->ecc_aggregate, value, 2);
      else if (strcmp(field, "mig") == 0)
        setFigure(&g->mig, value, 2);
      else if (strcmp(field, "process") == 0)
        addProcessRule(g, value);
      else
        fprintf(stderr, "fake_nvml: unknown setting %s in %s\n", key, path);
    } else {
      fprintf(stderr, "fake_nvml: unknown setting %s in %s\n", key, path);
    }
  }
  fclose(f);
  if (c->device_count < 0) c->device_count = highest + 1;
  if (c->device_count > MAX_GPUS) c->device_count = MAX_GPUS;
  return 1;
}

/* The GPU behind a handle, with the file read again; NULL (and *rc set) when there is none.
 * Returns with g_mutex held when it returns a GPU. */
static Gpu* lockGpu(nvmlDevice_t device, nvmlReturn_t* rc) {
  pthread_mutex_lock(&g_mutex);
  if (g_init_count == 0) {
    *rc = NVML_ERROR_UNINITIALIZED;
  } else if (!readConfig()) {
    *rc = NVML_ERROR_UNKNOWN;
  } else if (device < g_handles || device >= g_handles + MAX_GPUS ||
             device->index >= g_config.device_count) {
    *rc = NVML_ERROR_INVALID_ARGUMENT;
  } else {
    return &g_config.gpus[device->index];
  }
  pthread_mutex_unlock(&g_mutex);
  return NULL;
}

static nvmlReturn_t copyText(const Figure* f, char* out, unsigned int length) {
  if (f->rc != NVML_SUCCESS) return f->rc;
  if (!out) return NVML_ERROR_INVALID_ARGUMENT;
  if (strlen(f->text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
  strcpy(out, f->text);
  return NVML_SUCCESS;
}

EXPORT int fake_nvml_init_count(void) {
  pthread_mutex_lock(&g_mutex);
  int n = g_init_count;
  pthread_mutex_unlock(&g_mutex);
  return n;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) {
  pthread_mutex_lock(&g_mutex);
  nvmlReturn_t rc = NVML_SUCCESS;
  if (!readConfig())
    rc = NVML_ERROR_UNKNOWN;
  else if (g_config.init_error)
    rc = g_config.init_error;
  else
    ++g_init_count;
  pthread_mutex_unlock(&g_mutex);
  return rc;
}

EXPORT nvmlReturn_t nvmlShutdown(void) {
  pthread_mutex_lock(&g_mutex);
  nvmlReturn_t rc = NVML_SUCCESS;
  if (g_init_count == 0)
    rc = NVML_ERROR_UNINITIALIZED;
  else
    --g_init_count;
  pthread_mutex_unlock(&g_mutex);
  return rc;
}

/* NVML's own wording for the codes tests use. */
EXPORT const char* nvmlErrorString(nvmlReturn_t rc) {
  switch (rc) {
    case 0:
      return "Success";
    case 1:
      return "Uninitialized";
    case 2:
      return "Invalid Argument";
    case 3:
      return "Not Supported";
    case 4:
      return "Insufficient Permissions";
    case 6:
      return "Not Found";
    case 7:
      return "Insufficient Size";
    case 9:
      return "Driver Not Loaded";
    case 12:
      return "NVML Shared Library Not Found";
    case 15:
      return "GPU is lost";
    case 18:
      return "RM has detected an NVML/RM version mismatch.";
    default:
      return "Unknown Error";
  }
}

/* Locks g_mutex (the caller unlocks) and reads the file again. */
static nvmlReturn_t lockSystem(void) {
  pthread_mutex_lock(&g_mutex);
  if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED;
  if (!readConfig()) return NVML_ERROR_UNKNOWN;
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  nvmlReturn_t rc = lockSystem();
  if (rc == NVML_SUCCESS) rc = copyText(&g_config.driver_version, version, length);
  pthread_mutex_unlock(&g_mutex);
  return rc;
}

static nvmlReturn_t cudaDriverVersion(int* version) {
  nvmlReturn_t rc = lockSystem();
  if (rc == NVML_SUCCESS) rc = g_config.cuda_driver_version.rc;
  if (rc == NVML_SUCCESS) {
    if (version)
      *version = (int)g_config.cuda_driver_version.a;
    else
      rc = NVML_ERROR_INVALID_ARGUMENT;
  }
  pthread_mutex_unlock(&g_mutex);
  return rc;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int* version) {
  return cudaDriverVersion(version);
}

#ifndef FAKE_NVML_SPARSE
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* version) {
  return cudaDriverVersion(version);
}
#endif

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  nvmlReturn_t rc = lockSystem();
  if (rc == NVML_SUCCESS) {
    if (count)
      *count = (unsigned)g_config.device_count;
    else
      rc = NVML_ERROR_INVALID_ARGUMENT;
  }
  pthread_mutex_unlock(&g_mutex);
  return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  nvmlReturn_t rc = lockSystem();
  if (rc == NVML_SUCCESS) {
    if (!device || index >= (unsigned)g_config.device_count) {
      rc = NVML_ERROR_INVALID_ARGUMENT;
    } else if (g_config.gpus[index].handle.rc != NVML_SUCCESS) {
      rc = g_config.gpus[index].handle.rc; /* only an explicit error:N fails it */
    } else {
      g_handles[index].index = (int)index;
      *device = &g_handles[index];
    }
  }
  pthread_mutex_unlock(&g_mutex);
  return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) {
  nvmlReturn_t rc;
  Gpu* g = lockGpu(device, &rc);
  if (!g) return rc;
  rc = copyText(&g->name, name, length);
  pthread_mutex_unlock(&g_mutex);
  return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) {
  nvmlReturn_t rc;
  Gpu* g = lockGpu(device, &rc);
  if (!g) return rc;
  rc = copyText(&g->uuid, uuid, length);
  pthread_mutex_unlock(&g_mutex);
  return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int* major,
                                                       int* minor) {
  nvmlReturn_t rc;
  Gpu* g = lockGpu(device, &rc);
  if (!g) return rc;
  rc = g->compute_capability.rc;
  if (rc == NVML_SUCCESS && (!major || !minor)) rc = NVML_ERROR_INVALID_ARGUMENT;
  if (rc == NVML_SUCCESS) {
    *major = (int)g->compute_capability.a;
    *minor = (int)g->compute_capability.b;
  }
  pthread_mutex_unlock(&g_mutex);
  return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  nvmlReturn_t rc;
  Gpu* g = lockGpu(device, &rc);
  if (!g) return rc;
  rc = g->memory.rc;
  if (rc == NVML_SUCCESS && !memory) rc = NVML_ERROR_INVALID_ARGUMENT;
  if (rc == NVML_SUCCESS) {
    memory->total = g->memory.a;
    memory->used = g->memory.b;
    memory->free = g->memory.a > g->memory.b ? g->memory.a - g->memory.b : 0;
  }
  pthread_mutex_unlock(&g_mutex);
  return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                  nvmlUtilization_t* utilization) {
  nvmlReturn_t rc;
  Gpu* g = lockGpu(device, &rc);
  if (!g) return rc;
  rc = g->utilization.rc;
  if (rc == NVML_SUCCESS && !utilization) rc = NVML_ERROR_INVALID_ARGUMENT;
  if (rc == NVML_SUCCESS) {
    utilization->gpu = (unsigned)g->utilization.a;
    utilization->memory = (unsigned)g->utilization.b;
  }
  pthread_mutex_unlock(&g_mutex);
  return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor,
                                             unsigned int* temperature) {
  nvmlReturn_t rc;
  Gpu* g = lockGpu(device, &rc);
  if (!g) return rc;
  rc = g->temperature.rc;
  if (rc == NVML_SUCCESS && (sensor != 0 || !temperature)) rc = NVML_ERROR_INVALID_ARGUMENT;
  if (rc == NVML_SUCCESS) *temperature = (unsigned)g->temperature.a;
  pthread_mutex_unlock(&g_mutex);
  return rc;
}

static nvmlReturn_t throttleReasons(nvmlDevice_t device, unsigned long long* reasons) {
  nvmlReturn_t rc;
  Gpu* g = lockGpu(device, &rc);
  if (!g) return rc;
  rc = g->throttle.rc;
  if (rc == NVML_SUCCESS && !reasons) rc = NVML_ERROR_INVALID_ARGUMENT;
  if (rc == NVML_SUCCESS) *reasons = g->throttle.a;
  pthread_mutex_unlock(&g_mutex);
  return rc;
}

#ifndef FAKE_NVML_SPARSE
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                              unsigned long long* reasons) {
  return throttleReasons(device, reasons);
}
#else
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                           unsigned long long* reasons) {
  return throttleReasons(device, reasons);
}
#endif

/* errorType: 0 corrected, 1 uncorrected; counterType: 0 volatile, 1 aggregate. */
EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int error_type,
                                                int counter_type, unsigned long long* count) {
  nvmlReturn_t rc;
  Gpu* g = lockGpu(device, &rc);
  if (!g) return rc;
  const Figure* f = counter_type == 0 ? &g->ecc_volatile : &g->ecc_aggregate;
  rc = f->rc;
  if (rc == NVML_SUCCESS &&
      (!count || error_type < 0 || error_type > 1 || counter_type < 0 || counter_type > 1))
    rc = NVML_ERROR_INVALID_ARGUMENT;
  if (rc == NVML_SUCCESS) *count = error_type == 0 ? f->a : f->b;
  pthread_mutex_unlock(&g_mutex);
  return rc;
}

#ifndef FAKE_NVML_SPARSE
EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int* current,
                                         unsigned int* pending) {
  nvmlReturn_t rc;
  Gpu* g = lockGpu(device, &rc);
  if (!g) return rc;
  rc = g->mig.rc;
  if (rc == NVML_SUCCESS && (!current || !pending)) rc = NVML_ERROR_INVALID_ARGUMENT;
  if (rc == NVML_SUCCESS) {
    *current = (unsigned)g->mig.a;
    *pending = (unsigned)g->mig.b;
  }
  pthread_mutex_unlock(&g_mutex);
  return rc;
}
#endif

/* The parent pid from /proc/PID/stat, and whether the process is a zombie. */
static int readStat(long pid, long* ppid, int* zombie) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE* f = fopen(path, "re");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char* close = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
  char state;
  if (!close || sscanf(close + 1, " %c %ld", &state, ppid) != 2) return 0;
  *zombie = state == 'Z';
  return 1;
}

static int hasEnvironment(long pid, const char* entry) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%ld/environ", pid);
  FILE* f = fopen(path, "re");
  if (!f) return 0;
  size_t want = strlen(entry);
  char buf[4096];
  size_t len = 0;
  int found = 0, c;
  while (!found && (c = fgetc(f)) != EOF) {
    if (c == '\0') {
      found = len == want && memcmp(buf, entry, want) == 0;
      len = 0;
    } else if (len < sizeof buf) {
      buf[len++] = (char)c;
    }
  }
  fclose(f);
  return found;
}

static void addProcess(nvmlProcessInfo_t* list, unsigned* n, long pid, unsigned long long bytes) {
  if (*n == MAX_PROCESSES) return;
  list[*n].pid = (unsigned)pid;
  list[*n].usedGpuMemory = bytes;
  list[*n].gpuInstanceId = 0xFFFFFFFFu;
  list[*n].computeInstanceId = 0xFFFFFFFFu;
  ++*n;
}

static unsigned listProcesses(const Gpu* g, nvmlProcessInfo_t* list) {
  unsigned n = 0;
  for (int i = 0; i < g->nrules; ++i) {
    const ProcessRule* r = &g->rules[i];
    if (r->kind == kPid) {
      addProcess(list, &n, r->pid, r->bytes);
      continue;
    }
    DIR* d = opendir("/proc");
    if (!d) continue;
    for (struct dirent* e; (e = readdir(d));) {
      if (!isdigit((unsigned char)e->d_name[0])) continue;
      long pid = atol(e->d_name), ppid = 0;
      int zombie = 0;
      if (!readStat(pid, &ppid, &zombie) || zombie) continue;
      if (r->kind == kChildrenOf ? ppid == r->pid : hasEnvironment(pid, r->env))
        addProcess(list, &n, pid, r->bytes);
    }
    closedir(d);
  }
  return n;
}

#ifndef FAKE_NVML_SPARSE
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                            unsigned int* count,
                                                            nvmlProcessInfo_t* infos) {
  nvmlReturn_t rc;
  Gpu* g = lockGpu(device, &rc);
  if (!g) return rc;
  static nvmlProcessInfo_t list[MAX_PROCESSES];
  rc = g->processes.rc; /* succeeds with no processes unless the file says error:N */
  if (rc == NVML_SUCCESS && !count) rc = NVML_ERROR_INVALID_ARGUMENT;
  if (rc == NVML_SUCCESS) {
    unsigned n = listProcesses(g, list);
    if (*count < n) {
      rc = NVML_ERROR_INSUFFICIENT_SIZE; /* as NVML: says how many, fills nothing */
    } else if (n > 0 && !infos) {
      rc = NVML_ERROR_INVALID_ARGUMENT;
    } else if (n > 0) {
      memcpy(infos, list, n * sizeof *list);
    }
    *count = n;
  }
  pthread_mutex_unlock(&g_mutex);
  return rc;
}
#endif
