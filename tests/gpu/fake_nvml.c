/*
 * A fake libnvidia-ml.so.1 for populi's GPU probe tests.
 *
 * It implements exactly the NVML entry points populi_p2p.gpu.NvmlProbe reaches through the
 * real nvidia-ml-py binding, with the same C signatures and struct layouts, and serves
 * values from a fixture file named by $FAKE_NVML_FIXTURE: one "key=value" per line, '#'
 * comments. Global keys:
 *
 *   init_error=N            nvmlInit* returns NVML error N (e.g. 9: driver not loaded)
 *   init_sleep_ms=N         nvmlInit* sleeps first (a hung driver, for timeout tests)
 *   driver=550.54.14        nvmlSystemGetDriverVersion
 *   cuda=12040              nvmlSystemGetCudaDriverVersion
 *   count=N                 nvmlDeviceGetCount_v2
 *   count_drop_after=P      after P probes (calls of nvmlDeviceGetCount_v2) ...
 *   count_drop_to=N         ... the count becomes N (a GPU fell off the bus)
 *
 * Per device, prefixed "gpuI.": uuid, name, pci, cc (e.g. 8.9), mem_total, mem_used
 * (bytes; free = total - used), util_gpu, util_mem, temp, power_mw, power_limit_mw,
 * throttle (clocks throttle reason bitmask), ecc_corrected, ecc_uncorrected (absent:
 * NOT_SUPPORTED, as on GeForce), mig (0/1; absent: NOT_SUPPORTED), mig_count,
 * handle_error=N, lost_after=P (every call for the device returns GPU_IS_LOST once more
 * than P probes have started), xid=N (one critical XID event, delivered once after
 * registration), mem_reserved (the driver's own share, inside mem_used: with it,
 * nvmlDeviceGetMemoryInfo_v2 answers with it apart, as drivers since 510 do; without it
 * v2 is NOT_SUPPORTED, so the probe's v1 fallback is exercised). MIG instances:
 * "gpuI.migM." uuid, mem_total, mem_used, gi, ci.
 *
 * nvmlDeviceGetCurrentClocksEventReasons is deliberately absent, like drivers before
 * 535, so the probe's fallback to the older ...ThrottleReasons name is exercised.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_KEYS 512
#define MAX_GPUS 16
#define MAX_MIG 7

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_UNKNOWN 999

typedef struct fake_dev {
    int gpu;
    int mig; /* -1: the physical GPU */
} fake_dev;
typedef fake_dev *nvmlDevice_t;
typedef struct fake_set { int registered[MAX_GPUS]; int delivered[MAX_GPUS]; } *nvmlEventSet_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

static char keys[MAX_KEYS][96];
static char values[MAX_KEYS][160];
static int nkeys = 0;
static int initialised = 0;
static int probes = 0;
static fake_dev gpus[MAX_GPUS];
static fake_dev migs[MAX_GPUS][MAX_MIG];

static void load(void) {
    const char *path = getenv("FAKE_NVML_FIXTURE");
    char line[300];
    FILE *fh;
    nkeys = 0;
    if (path == NULL || (fh = fopen(path, "r")) == NULL) return;
    while (nkeys < MAX_KEYS && fgets(line, sizeof line, fh) != NULL) {
        char *eq = strchr(line, '=');
        size_t n;
        if (line[0] == '#' || eq == NULL) continue;
        *eq = '\0';
        n = strcspn(eq + 1, "\r\n");
        eq[1 + n] = '\0';
        snprintf(keys[nkeys], sizeof keys[0], "%.95s", line);
        snprintf(values[nkeys], sizeof values[0], "%.159s", eq + 1);
        nkeys++;
    }
    fclose(fh);
}

static const char *get(const char *key) {
    for (int i = 0; i < nkeys; i++)
        if (strcmp(keys[i], key) == 0) return values[i];
    return NULL;
}

static const char *dget(const fake_dev *d, const char *field) {
    char key[96];
    if (d->mig >= 0)
        snprintf(key, sizeof key, "gpu%d.mig%d.%s", d->gpu, d->mig, field);
    else
        snprintf(key, sizeof key, "gpu%d.%s", d->gpu, field);
    return get(key);
}

static long long num(const char *text, long long fallback) {
    return text ? strtoll(text, NULL, 10) : fallback;
}

static int copy_string(const char *text, char *out, unsigned int length) {
    if (text == NULL) return NVML_ERROR_NOT_SUPPORTED;
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

static int gpu_count(void) {
    long long drop_after = num(get("count_drop_after"), -1);
    if (drop_after >= 0 && probes > drop_after) return (int)num(get("count_drop_to"), 0);
    return (int)num(get("count"), 0);
}

/* Common checks for every per-device call: initialised, valid handle, not lost. */
static int check(nvmlDevice_t d) {
    fake_dev parent;
    long long lost_after;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (d == NULL || d->gpu < 0 || d->gpu >= MAX_GPUS) return NVML_ERROR_INVALID_ARGUMENT;
    parent.gpu = d->gpu;
    parent.mig = -1;
    lost_after = num(dget(&parent, "lost_after"), -1);
    if (lost_after >= 0 && probes > lost_after) return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

#define CHECK(d) do { int rc_ = check(d); if (rc_ != NVML_SUCCESS) return rc_; } while (0)

int nvmlInitWithFlags(unsigned int flags) {
    long long sleep_ms;
    (void)flags;
    load();
    sleep_ms = num(get("init_sleep_ms"), 0);
    if (sleep_ms > 0) {
        struct timespec ts = {sleep_ms / 1000, (sleep_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (get("init_error")) return (int)num(get("init_error"), NVML_ERROR_UNKNOWN);
    for (int i = 0; i < MAX_GPUS; i++) {
        gpus[i].gpu = i;
        gpus[i].mig = -1;
        for (int m = 0; m < MAX_MIG; m++) {
            migs[i][m].gpu = i;
            migs[i][m].mig = m;
        }
    }
    initialised = 1;
    return NVML_SUCCESS;
}

int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

int nvmlShutdown(void) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    initialised = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(int result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

int nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    return copy_string(get("driver") ? get("driver") : "550.54.14", version, length);
}

int nvmlSystemGetCudaDriverVersion(int *version) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    *version = (int)num(get("cuda"), 12040);
    return NVML_SUCCESS;
}

int nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    probes++;
    *count = (unsigned int)gpu_count();
    return NVML_SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    fake_dev probe_dev;
    long long handle_error;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if ((int)index >= gpu_count() || index >= MAX_GPUS) return NVML_ERROR_INVALID_ARGUMENT;
    probe_dev.gpu = (int)index;
    probe_dev.mig = -1;
    handle_error = num(dget(&probe_dev, "handle_error"), 0);
    if (handle_error) return (int)handle_error;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

int nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
    CHECK(d);
    return copy_string(dget(d, "uuid"), uuid, length);
}

int nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
    CHECK(d);
    return copy_string(dget(d, "name"), name, length);
}

int nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    const char *bus;
    CHECK(d);
    bus = dget(d, "pci");
    if (bus == NULL) return NVML_ERROR_NOT_SUPPORTED;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%.31s", bus);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%.15s", bus);
    return NVML_SUCCESS;
}

int nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
    const char *cc;
    CHECK(d);
    cc = dget(d, "cc");
    if (cc == NULL || sscanf(cc, "%d.%d", major, minor) != 2) return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

int nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *memory) {
    CHECK(d);
    if (dget(d, "mem_total") == NULL) return NVML_ERROR_NOT_SUPPORTED;
    memory->total = (unsigned long long)num(dget(d, "mem_total"), 0);
    memory->used = (unsigned long long)num(dget(d, "mem_used"), 0);
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *memory) {
    unsigned long long used;
    CHECK(d);
    if (dget(d, "mem_total") == NULL || dget(d, "mem_reserved") == NULL)
        return NVML_ERROR_NOT_SUPPORTED;
    memory->total = (unsigned long long)num(dget(d, "mem_total"), 0);
    memory->reserved = (unsigned long long)num(dget(d, "mem_reserved"), 0);
    used = (unsigned long long)num(dget(d, "mem_used"), 0);
    memory->used = used - memory->reserved;
    memory->free = memory->total - used;
    return NVML_SUCCESS;
}

int nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *util) {
    CHECK(d);
    if (dget(d, "util_gpu") == NULL) return NVML_ERROR_NOT_SUPPORTED;
    util->gpu = (unsigned int)num(dget(d, "util_gpu"), 0);
    util->memory = (unsigned int)num(dget(d, "util_mem"), 0);
    return NVML_SUCCESS;
}

int nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *temp) {
    CHECK(d);
    if (sensor != 0 || dget(d, "temp") == NULL) return NVML_ERROR_NOT_SUPPORTED;
    *temp = (unsigned int)num(dget(d, "temp"), 0);
    return NVML_SUCCESS;
}

int nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    CHECK(d);
    if (dget(d, "power_mw") == NULL) return NVML_ERROR_NOT_SUPPORTED;
    *mw = (unsigned int)num(dget(d, "power_mw"), 0);
    return NVML_SUCCESS;
}

int nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw) {
    CHECK(d);
    if (dget(d, "power_limit_mw") == NULL) return NVML_ERROR_NOT_SUPPORTED;
    *mw = (unsigned int)num(dget(d, "power_limit_mw"), 0);
    return NVML_SUCCESS;
}

int nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *reasons) {
    CHECK(d);
    *reasons = (unsigned long long)num(dget(d, "throttle"), 0);
    return NVML_SUCCESS;
}

int nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int error_type, int counter_type,
                                unsigned long long *count) {
    const char *value;
    CHECK(d);
    if (counter_type != 0) return NVML_ERROR_NOT_SUPPORTED; /* only volatile counters */
    value = dget(d, error_type == 0 ? "ecc_corrected" : "ecc_uncorrected");
    if (value == NULL) return NVML_ERROR_NOT_SUPPORTED;
    *count = (unsigned long long)num(value, 0);
    return NVML_SUCCESS;
}

int nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    CHECK(d);
    if (dget(d, "mig") == NULL) return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = (unsigned int)num(dget(d, "mig"), 0);
    return NVML_SUCCESS;
}

int nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count) {
    CHECK(d);
    if (num(dget(d, "mig"), 0) == 0) return NVML_ERROR_NOT_SUPPORTED;
    *count = MAX_MIG;
    return NVML_SUCCESS;
}

int nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *mig) {
    CHECK(d);
    if (index >= MAX_MIG || (long long)index >= num(dget(d, "mig_count"), 0))
        return NVML_ERROR_NOT_FOUND;
    *mig = &migs[d->gpu][index];
    return NVML_SUCCESS;
}

int nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) {
    CHECK(d);
    if (d->mig < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *id = (unsigned int)num(dget(d, "gi"), 0);
    return NVML_SUCCESS;
}

int nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id) {
    CHECK(d);
    if (d->mig < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *id = (unsigned int)num(dget(d, "ci"), 0);
    return NVML_SUCCESS;
}

int nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    *set = calloc(1, sizeof **set);
    return *set ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

int nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    CHECK(d);
    if (set == NULL || !(types & 0x8)) return NVML_ERROR_INVALID_ARGUMENT;
    set->registered[d->gpu] = 1;
    return NVML_SUCCESS;
}

int nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    (void)timeout_ms;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    for (int i = 0; i < MAX_GPUS; i++) {
        if (set->registered[i] && !set->delivered[i] && dget(&gpus[i], "xid") != NULL) {
            set->delivered[i] = 1;
            memset(data, 0, sizeof *data);
            data->device = &gpus[i];
            data->eventType = 0x8;
            data->eventData = (unsigned long long)num(dget(&gpus[i], "xid"), 0);
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_TIMEOUT;
}

int nvmlEventSetFree(nvmlEventSet_t set) {
    free(set);
    return NVML_SUCCESS;
}
