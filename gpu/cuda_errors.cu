/* cuda_errors: what the driver says, in words a user can act on.
 *
 * DESIGN
 * Backend selection needs three answers, not two: a device is usable; there
 * is truly no device (no NVIDIA driver installed, or the driver sees no GPU:
 * `--backend auto` may fall back to the CPU); or a device is there but CUDA
 * cannot use it (a driver older than the runtime kgen was built with, a
 * kernel-module/libcuda mismatch, a busy exclusive-mode GPU). The last must
 * stop `auto` too: silently running an 8B model on the CPU of a GPU host is
 * worse than failing with the reason. cudaGetDeviceCount alone cannot tell
 * "no driver" from "old driver" (both are cudaErrorInsufficientDriver), so
 * the probe also asks cudaDriverGetVersion, which returns 0 when no driver
 * is installed. The classification is a pure function of those facts
 * (kg_cuda_probe_classify), so the tests cover every case without a GPU.
 *
 * A sticky error (an illegal address, a launch failure, an ECC error)
 * poisons the CUDA context: every later call fails until the process
 * exits. kg_cuda_error_is_sticky says which; the backend uses it to tell a
 * device-wide fault (stop the worker) from a failure it can recover from
 * (a graph capture that did not work: run eagerly instead). */
#include "cuda_common.cuh"
#include "kg_backend_cuda.h"

#include <string.h>

static void version_str(int v, char *out, size_t size) {
    snprintf(out, size, "%d.%d", v / 1000, (v % 1000) / 10);
}

extern "C" const char *kg_cuda_probe_kind_str(kg_cuda_probe_kind_t kind) {
    switch (kind) {
    case KG_CUDA_PROBE_OK:
        return "ok";
    case KG_CUDA_PROBE_NO_DEVICE:
        return "no_device";
    case KG_CUDA_PROBE_UNUSABLE:
        return "unusable";
    }
    return "unknown";
}

extern "C" bool kg_cuda_error_is_sticky(int err) {
    switch ((cudaError_t)err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorECCUncorrectable:
    case cudaErrorUnknown:
        return true;
    default:
        return false;
    }
}

/* What to do about an error cudaGetDeviceCount returned with a driver present. */
static const char *hint(int err) {
    switch ((cudaError_t)err) {
    case cudaErrorInsufficientDriver:
        return "update the NVIDIA driver (or install the CUDA forward-compatibility package)";
    case cudaErrorSystemDriverMismatch:
        return "the kernel module and libcuda are different driver versions: reinstall the "
               "driver or reboot";
    case cudaErrorCompatNotSupportedOnDevice:
        return "CUDA forward compatibility is not supported on this GPU: install a driver "
               "made for this CUDA version";
    case cudaErrorDevicesUnavailable:
        return "the GPU is busy (exclusive-process mode) or unavailable";
    case cudaErrorInitializationError:
        return "the driver failed to initialise (see nvidia-smi and the kernel log)";
    default:
        return "see nvidia-smi and the kernel log";
    }
}

extern "C" void kg_cuda_probe_classify(kg_cuda_probe_t *p) {
    char drv[16], rt[16];
    version_str(p->driver_version, drv, sizeof(drv));
    version_str(p->runtime_version, rt, sizeof(rt));
    const char *name = cudaGetErrorName((cudaError_t)p->error);
    const char *text = cudaGetErrorString((cudaError_t)p->error);
    if (p->error == cudaSuccess && p->n_devices > 0) {
        p->kind = KG_CUDA_PROBE_OK;
        snprintf(p->message, sizeof(p->message),
                 "%d CUDA device(s), driver for CUDA %s, runtime CUDA %s", p->n_devices, drv, rt);
    } else if (p->driver_version == 0) {
        /* cudart reports a missing libcuda as an insufficient driver */
        p->kind = KG_CUDA_PROBE_NO_DEVICE;
        snprintf(p->message, sizeof(p->message),
                 "no CUDA device: no NVIDIA driver is installed (%s from cudaGetDeviceCount)",
                 name);
    } else if (p->error == cudaSuccess || p->error == cudaErrorNoDevice) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        p->kind = KG_CUDA_PROBE_NO_DEVICE;
        snprintf(p->message, sizeof(p->message),
                 "no CUDA device: the driver (CUDA %s) sees none (CUDA_VISIBLE_DEVICES=%s)", drv,
                 vis ? vis : "unset");
    } else if (p->error == cudaErrorInsufficientDriver) {
        p->kind = KG_CUDA_PROBE_UNUSABLE;
        snprintf(p->message, sizeof(p->message),
                 "CUDA device unusable: %s (%s): the NVIDIA driver supports CUDA %s, kgen was "
                 "built with the CUDA %s runtime; %s",
                 name, text, drv, rt, hint(p->error));
    } else {
        p->kind = KG_CUDA_PROBE_UNUSABLE;
        snprintf(p->message, sizeof(p->message),
                 "CUDA device unusable: %s (%s) from cudaGetDeviceCount (driver CUDA %s, runtime "
                 "CUDA %s); %s",
                 name, text, drv, rt, hint(p->error));
    }
}

extern "C" void kg_cuda_probe(kg_cuda_probe_t *p) {
    memset(p, 0, sizeof(*p));
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        cudaGetLastError(); /* not sticky: do not leave it for the next caller */
        n = 0;
    }
    p->error = (int)err;
    p->n_devices = n;
    if (cudaDriverGetVersion(&p->driver_version) != cudaSuccess) {
        p->driver_version = 0;
    }
    if (cudaRuntimeGetVersion(&p->runtime_version) != cudaSuccess) {
        p->runtime_version = CUDART_VERSION;
    }
    kg_cuda_probe_classify(p);
}

extern "C" bool kg_backend_cuda_available(void) {
    kg_cuda_probe_t p;
    kg_cuda_probe(&p);
    return p.kind == KG_CUDA_PROBE_OK;
}
