/*
 * kiln device plugin ABI, version 1.2.
 *
 * A vendor gives kiln a new device by building a shared library that exports one symbol,
 *
 *     KilnStatus kiln_device_plugin_init(KilnPluginParams* params);
 *
 * which fills `params` with the device type name, the plugin's version and a table of C
 * functions (`KilnDeviceInterface`). kiln loads the library (by path, or every library in the
 * directories of KILN_PLUGIN_PATH), checks the table, and registers the device as the backend
 * `device_api.<device_type>` with an extension device code. See docs/plugins.md for a walk-through.
 *
 * Versioning (as OpenXLA's PJRT C API does it):
 *   - Every struct starts with `struct_size`, `abi_major`, `abi_minor`.
 *   - Fields are only ever appended. A minor version adds fields at the end of a struct; a major
 *     version is an incompatible change.
 *   - kiln accepts a table from an older minor version (a smaller `struct_size`): the entries past
 *     its end are treated as absent and their documented fallbacks apply. It ignores entries past
 *     the end of its own definition (a newer minor version). It refuses a table whose `abi_major`
 *     differs from KILN_PLUGIN_ABI_MAJOR, or whose size is smaller than the 1.0 table.
 *   - Fill `struct_size` with KILN_STRUCT_SIZE-based constants or `sizeof` of the struct as your
 *     header defines it, and the version fields with KILN_PLUGIN_ABI_MAJOR/MINOR.
 *
 * Conventions:
 *   - Every function returns a KilnStatus; KILN_STATUS_SUCCESS is 0. On failure, the plugin sets a
 *     message that `get_last_error` returns *on the calling thread* until the next call on that
 *     thread. kiln reads it right after the failing call and puts it in the error it reports.
 *   - Every device entry takes the device id (0 .. count-1) explicitly; the plugin need not rely
 *     on a current device.
 *   - Device pointers (`void*` below) are opaque to kiln: kiln never dereferences them, it only
 *     adds offsets inside an allocation. `device_memory_allocate` must return addresses aligned to
 *     at least KILN_PLUGIN_MIN_ALIGNMENT bytes.
 *   - Streams and events are opaque handles created by the plugin. kiln only passes handles the
 *     plugin created and has not destroyed (kiln checks its own handles first), never NULL; kiln
 *     creates one stream per device as that device's default stream.
 *   - Entries may be called from any thread, concurrently.
 *   - kiln checks every value a plugin returns before using it: device counts (at most 1024),
 *     device ids (distinct, below 2^31), names and strings (bounded reads, NUL required), string
 *     attributes (NUL within KILN_ATTR_STRING_CAPACITY), handles (non-NULL, not already live),
 *     allocations (aligned, not wrapping around), kernel counts (at most 65536) and memory
 *     statistics (free <= total <= INT64_MAX). A bad value is refused with a message naming what
 *     was expected and what was seen; it never takes the process down.
 *   - "Required" entries must be non-NULL: kiln refuses a plugin that leaves one NULL and names
 *     every missing one. "Optional" entries may be NULL: kiln then applies the fallback given.
 */
#ifndef KILN_DEVICE_PLUGIN_H_
#define KILN_DEVICE_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_PLUGIN_ABI_MAJOR 1 /* incompatible changes */
#define KILN_PLUGIN_ABI_MINOR 2 /* fields appended */

/* The name of the entry symbol. */
#define KILN_PLUGIN_ENTRY_SYMBOL "kiln_device_plugin_init"

/* The minimum alignment of addresses returned by device_memory_allocate. */
#define KILN_PLUGIN_MIN_ALIGNMENT 256

/* The size of a struct up to and including `last_field` (PJRT_STRUCT_SIZE). */
#define KILN_STRUCT_SIZE(type, last_field) \
  (offsetof(type, last_field) + sizeof(((type*)0)->last_field))

/* ------------------------------------------------------------------------------------------ */
/* Status codes. Unknown non-zero codes are treated as KILN_STATUS_ERROR.                       */

typedef int32_t KilnStatus;
#define KILN_STATUS_SUCCESS 0          /* done */
#define KILN_STATUS_ERROR 1            /* failed; see get_last_error */
#define KILN_STATUS_OUT_OF_MEMORY 2    /* an allocation could not be satisfied */
#define KILN_STATUS_INVALID_ARGUMENT 3 /* a bad pointer, range, handle or device id */
#define KILN_STATUS_NOT_READY 4        /* query_stream / query_event: work still pending */
#define KILN_STATUS_UNSUPPORTED 5      /* get_attribute: unknown kind */
#define KILN_STATUS_VERSION_MISMATCH 6 /* kiln_device_plugin_init: incompatible kiln */

/* Opaque plugin handles. */
typedef struct KilnPluginStream_st* KilnStream;
typedef struct KilnPluginEvent_st* KilnEvent;

/* A host callback queued on a stream (see stream_add_callback). `status` is KILN_STATUS_SUCCESS,
 * or an error when work queued before it on the stream failed. */
typedef void (*KilnStreamCallback)(void* user_data, KilnStatus status);

/* The tvm-ffi safe-call convention (TVMFFISafeCallType; `args` and `result` are TVMFFIAny*):
 * returns 0 on success, or -1 after raising an error through TVMFFIErrorSetRaisedFromCStr,
 * reachable through the context slot `void* __TVMFFIErrorSetRaisedFromCStr` that kiln fills when
 * it loads the plugin (declare it in your library, initialized to NULL). */
typedef int32_t (*KilnSafeCall)(void* self, const void* args, int32_t num_args, void* result);

/* ------------------------------------------------------------------------------------------ */
/* Attribute values (get_attribute). Kinds are TVM's DeviceAttrKind codes:                      */
/* 0 exist, 1 max_threads_per_block, 2 warp_size, 3 max_shared_memory_per_block,               */
/* 4 compute_version, 5 device_name, 6 max_clock_rate, 7 multi_processor_count,                */
/* 8 max_thread_dimensions, 9 max_registers_per_block, 10 gcn_arch, 11 api_version,            */
/* 12 driver_version, 13 l2_cache_size_bytes, 14 total_global_memory,                          */
/* 15 available_global_memory, 16 image_pitch_alignment.                                       */

/* kiln's own kinds (outside TVM's codes):                                                   */
/* KILN_ATTR_KIND_PINNED_STAGING: answer KILN_ATTR_INT 1 (for device 0) to ask kiln to stage    */
/* asynchronous copies between your devices and ordinary host memory through host_memory_allocate */
/* buffers (chunked, double-buffered); 0 or UNSUPPORTED leaves them direct. The environment     */
/* variable KILN_PLUGIN_PINNED_STAGING=1/0 overrides the answer for every plugin.                */
#define KILN_ATTR_KIND_PINNED_STAGING 1000

#define KILN_ATTR_NONE 0
#define KILN_ATTR_INT 1
#define KILN_ATTR_STRING 2
#define KILN_ATTR_STRING_CAPACITY 256

typedef struct KilnAttrValue {
  size_t struct_size; /* kiln fills */
  uint32_t abi_major; /* kiln fills */
  uint32_t abi_minor; /* kiln fills */
  int32_t type;       /* plugin fills: KILN_ATTR_NONE / _INT / _STRING */
  int32_t reserved;
  int64_t int_value;                          /* when type == KILN_ATTR_INT */
  char string_value[KILN_ATTR_STRING_CAPACITY]; /* NUL-terminated, when type == KILN_ATTR_STRING */
} KilnAttrValue;

/* ------------------------------------------------------------------------------------------ */
/* Kernels: packed functions the plugin adds to kiln's global registry as `<device_type>.<name>` */
/* (the CustomDevice custom-kernel story on tvm-ffi packed functions).                          */

typedef struct KilnPluginKernel {
  size_t struct_size; /* sizeof(KilnPluginKernel); also the array stride */
  uint32_t abi_major;
  uint32_t abi_minor;
  const char* name;  /* e.g. "add": registered as "<device_type>.add"; static storage */
  KilnSafeCall call; /* the function */
  void* self;        /* passed as `self` to every call */
} KilnPluginKernel;

/* ------------------------------------------------------------------------------------------ */
/* The function table. R = required, O = optional (fallback in brackets).                     */

typedef struct KilnDeviceInterface {
  size_t struct_size; /* KILN_DEVICE_INTERFACE_SIZE (or the size of the version you implement) */
  uint32_t abi_major; /* KILN_PLUGIN_ABI_MAJOR */
  uint32_t abi_minor; /* KILN_PLUGIN_ABI_MINOR (or the minor version you implement) */

  /* ---- device ---- */
  /* O. Called once after the table is accepted, before any other entry. A failure refuses the
   *    plugin with its message. [nothing to do] */
  KilnStatus (*initialize)(void);
  /* O. Called once when kiln unloads the plugin (kiln keeps registered plugins until the process
   *    exits and does not call it at exit). [nothing to do] */
  KilnStatus (*finalize)(void);
  /* O. Called for each device after initialize; a failure refuses the plugin. [nothing to do] */
  KilnStatus (*init_device)(int32_t device);
  /* O. Called for each device before finalize. [nothing to do] */
  KilnStatus (*deinit_device)(int32_t device);
  /* O. Makes `device` the calling thread's current device (kiln's set_device). [kiln tracks the
   *    current device itself; every entry takes the device id anyway] */
  KilnStatus (*set_device)(int32_t device);
  /* O. The calling thread's current device. [kiln's own per-thread record] */
  KilnStatus (*get_device)(int32_t* device);
  /* O. Blocks until all work on all streams of `device` has completed. [kiln synchronizes every
   *    live stream of the device] */
  KilnStatus (*synchronize_device)(int32_t device);
  /* R. The number of devices. 0 is allowed (the backend is registered without devices); more than
   *    1024 is refused. */
  KilnStatus (*get_device_count)(size_t* count);
  /* O. Writes the ids of the visible devices into `devices` (room for get_device_count
   *    entries). kiln uses ids 0..count-1; the list is shown by `kiln devices`. [0..count-1] */
  KilnStatus (*get_device_list)(size_t* devices);
  /* O. Compute capability as major*10+minor (86 for 8.6). [attribute compute_version absent] */
  KilnStatus (*get_compute_capability)(int32_t device, size_t* capability);
  /* O. Runtime version, e.g. 1020 for 1.2.0. [attribute api_version absent] */
  KilnStatus (*get_runtime_version)(size_t* version);
  /* O. Driver version. [attribute driver_version absent] */
  KilnStatus (*get_driver_version)(size_t* version);

  /* ---- memory: allocation ---- */
  /* R. Allocates `size` bytes of device memory at `*ptr`, aligned to KILN_PLUGIN_MIN_ALIGNMENT.
   *    kiln allocates in chunks (see the chunk sizes below) and carves them itself, so this is
   *    called rarely. Return KILN_STATUS_OUT_OF_MEMORY when the device is full. */
  KilnStatus (*device_memory_allocate)(int32_t device, void** ptr, size_t size);
  /* R. Frees memory from device_memory_allocate; `size` is the size allocated. */
  KilnStatus (*device_memory_deallocate)(int32_t device, void* ptr, size_t size);
  /* O. Allocates page-locked host memory (a real host pointer). kiln uses it as the staging
   *    buffer of copies that go through the host (between two devices of this plugin without
   *    p2p entries) and, when the plugin opts in (KILN_ATTR_KIND_PINNED_STAGING), of
   *    asynchronous copies between a device and ordinary host memory; it keeps one buffer of up
   *    to 64 MiB cached per device. [kiln uses ordinary host memory for staging buffers] */
  KilnStatus (*host_memory_allocate)(int32_t device, void** ptr, size_t size);
  /* O. Frees memory from host_memory_allocate. [required if host_memory_allocate is set] */
  KilnStatus (*host_memory_deallocate)(int32_t device, void* ptr, size_t size);
  /* O. Allocates memory visible to host and device (kiln memory scope "global.unified").
   *    [the scope is unsupported] */
  KilnStatus (*unified_memory_allocate)(int32_t device, void** ptr, size_t size);
  /* O. Frees memory from unified_memory_allocate. [required if unified_memory_allocate is set] */
  KilnStatus (*unified_memory_deallocate)(int32_t device, void* ptr, size_t size);

  /* ---- memory: synchronous copies (complete before returning) ---- */
  /* R. Host to device. */
  KilnStatus (*memory_copy_h2d)(int32_t device, void* dst, const void* src, size_t size);
  /* R. Device to host. */
  KilnStatus (*memory_copy_d2h)(int32_t device, void* dst, const void* src, size_t size);
  /* R. Device to device, on one device. The ranges may overlap (two views of one allocation):
   *    kiln passes such copies through unchanged and does not order or split them. Their result
   *    is the plugin's to define; as with cudaMemcpy, it is undefined unless the plugin documents
   *    memmove semantics (the sample uses memmove). Applies to async_memory_copy_d2d too. */
  KilnStatus (*memory_copy_d2d)(int32_t device, void* dst, const void* src, size_t size);
  /* O. Between two devices of this plugin. [d2h into a host buffer, then h2d] */
  KilnStatus (*memory_copy_p2p)(int32_t dst_device, int32_t src_device, void* dst, const void* src,
                                size_t size);

  /* ---- memory: asynchronous copies, ordered on `stream` of `device` ---- */
  /* The host buffer stays valid until the stream is synchronized (kiln guarantees it).       */
  /* O. [synchronize the stream, then memory_copy_h2d] */
  KilnStatus (*async_memory_copy_h2d)(int32_t device, KilnStream stream, void* dst,
                                      const void* src, size_t size);
  /* O. [synchronize the stream, then memory_copy_d2h] */
  KilnStatus (*async_memory_copy_d2h)(int32_t device, KilnStream stream, void* dst,
                                      const void* src, size_t size);
  /* O. [synchronize the stream, then memory_copy_d2d] */
  KilnStatus (*async_memory_copy_d2d)(int32_t device, KilnStream stream, void* dst,
                                      const void* src, size_t size);
  /* O. `stream` belongs to `src_device`. [synchronize, then memory_copy_p2p or its fallback] */
  KilnStatus (*async_memory_copy_p2p)(int32_t dst_device, int32_t src_device, KilnStream stream,
                                      void* dst, const void* src, size_t size);

  /* ---- memory: fill, statistics and allocator tuning ---- */
  /* O. Sets `size` bytes at `ptr` to `value`, synchronously. [fill a host buffer, h2d] */
  KilnStatus (*device_memory_set)(int32_t device, void* ptr, unsigned char value, size_t size);
  /* O. Total and free device memory in bytes. [total/free unknown; max alloc unlimited] */
  KilnStatus (*device_memory_stats)(int32_t device, size_t* total_memory, size_t* free_memory);
  /* O. The granularity of kiln's blocks (rounded up to a power of two >= 64). [256] */
  KilnStatus (*device_min_chunk_size)(int32_t device, size_t* size);
  /* O. The largest chunk kiln requests for carving; larger requests get their own chunk.
   *    [64 MiB] */
  KilnStatus (*device_max_chunk_size)(int32_t device, size_t* size);
  /* O. The largest single allocation; larger requests fail without calling the plugin.
   *    [total memory from device_memory_stats, else unlimited] */
  KilnStatus (*device_max_alloc_size)(int32_t device, size_t* size);
  /* O. Bytes added to every block (for devices that read past the end). [0] */
  KilnStatus (*device_extra_padding_size)(int32_t device, size_t* size);
  /* O. Bytes kiln allocates per device at load time (a first chunk). [0] */
  KilnStatus (*device_init_alloc_size)(int32_t device, size_t* size);
  /* O. The size of each new chunk when the cached ones are full. [8 MiB] */
  KilnStatus (*device_realloc_size)(int32_t device, size_t* size);

  /* ---- streams ---- */
  /* R. Creates a stream whose work runs in order, asynchronously to the host. */
  KilnStatus (*create_stream)(int32_t device, KilnStream* stream);
  /* R. Waits for the stream's queued work (running its callbacks), then destroys it. */
  KilnStatus (*destroy_stream)(int32_t device, KilnStream stream);
  /* O. SUCCESS if all queued work has completed, NOT_READY if not; never blocks.
   *    [synchronize_stream, then "completed": the fallback BLOCKS until the stream drains, and a
   *    failure of queued work is reported (and consumed) by the query. kiln never uses the query
   *    to check a handle (set_current_stream, sync_stream_from_to check kiln's own table), so
   *    such failures stay with the next synchronize] */
  KilnStatus (*query_stream)(int32_t device, KilnStream stream);
  /* R. Blocks until all queued work has completed. If queued work failed since the last
   *    synchronize, returns an error with that work's message (once; the stream stays usable). */
  KilnStatus (*synchronize_stream)(int32_t device, KilnStream stream);
  /* O. Queues `callback(user_data, status)`: the plugin calls it exactly once, on any thread,
   *    after the work queued before it and before the work queued after it runs. On a non-success
   *    return the plugin never calls it. [synchronize the stream, then call it on the host] */
  KilnStatus (*stream_add_callback)(int32_t device, KilnStream stream, KilnStreamCallback callback,
                                    void* user_data);
  /* R. Work queued on `stream` after this call waits until `event` completes. */
  KilnStatus (*stream_wait_event)(int32_t device, KilnStream stream, KilnEvent event);

  /* ---- events ---- */
  /* R. Creates an event. An event never recorded counts as completed. */
  KilnStatus (*create_event)(int32_t device, KilnEvent* event);
  /* R. Destroys an event. It may be called while waits on the event (stream_wait_event) are
   *    still queued: kiln's sync_stream_from_to records a temporary event, queues the wait and
   *    destroys the event at once (as cudaEventDestroy allows). The plugin must keep what those
   *    queued waits need until they have run. */
  KilnStatus (*destroy_event)(int32_t device, KilnEvent event);
  /* R. Records `event` at the current end of `stream` (re-recording replaces the earlier point). */
  KilnStatus (*record_event)(int32_t device, KilnStream stream, KilnEvent event);
  /* O. SUCCESS if the work before the recorded point has completed, NOT_READY if not.
   *    [synchronize_event, then "completed"] */
  KilnStatus (*query_event)(int32_t device, KilnEvent event);
  /* R. Blocks until the work before the recorded point has completed. */
  KilnStatus (*synchronize_event)(int32_t device, KilnEvent event);

  /* ---- errors ---- */
  /* O. The message of the last failed call on the calling thread (NUL-terminated; valid until
   *    the next call on this thread), or NULL. kiln reads at most 4095 bytes of it and cuts a
   *    longer message (or one without a NUL) there. [kiln reports the status code alone] */
  const char* (*get_last_error)(void);

  /* ---- ABI 1.1: appended ---- */
  /* O. One attribute of `device` (TVM's DeviceAttrKind `kind`, see above). Return
   *    KILN_STATUS_UNSUPPORTED for kinds you do not know. [kiln answers device_name from the
   *    device type, compute/api/driver versions and memory sizes from the entries above] */
  KilnStatus (*get_attribute)(int32_t device, int32_t kind, KilnAttrValue* value);
  /* O. The plugin's kernels: `*kernels` points to `*count` entries (stride
   *    kernels[0].struct_size) in static storage. kiln registers each as the global packed
   *    function "<device_type>.<name>". Kernels run on the host thread that calls them and may
   *    take tensors whose data are this plugin's device pointers. [no kernels] */
  KilnStatus (*get_kernels)(const KilnPluginKernel** kernels, size_t* count);

  /* ---- ABI 1.2: appended ---- */
  /* O. Queues a fill of `size` bytes at `ptr` with `value` on `stream`, ordered like the async
   *    copies (a failure is reported by the next synchronize_stream). kiln checks the range
   *    first. [synchronize the stream, then device_memory_set, or fill a host buffer and h2d] */
  KilnStatus (*async_memory_set)(int32_t device, KilnStream stream, void* ptr, unsigned char value,
                                 size_t size);
} KilnDeviceInterface;

/* The size of the 1.0 table (everything up to get_last_error), the 1.1 table (up to get_kernels)
 * and today's. */
#define KILN_DEVICE_INTERFACE_SIZE_1_0 KILN_STRUCT_SIZE(KilnDeviceInterface, get_last_error)
#define KILN_DEVICE_INTERFACE_SIZE_1_1 KILN_STRUCT_SIZE(KilnDeviceInterface, get_kernels)
#define KILN_DEVICE_INTERFACE_SIZE KILN_STRUCT_SIZE(KilnDeviceInterface, async_memory_set)

/* ------------------------------------------------------------------------------------------ */
/* The entry point's parameters.                                                               */

typedef struct KilnPluginParams {
  size_t struct_size; /* kiln fills: sizeof(KilnPluginParams) as kiln knows it */
  uint32_t abi_major; /* kiln fills: kiln's KILN_PLUGIN_ABI_MAJOR */
  uint32_t abi_minor; /* kiln fills: kiln's KILN_PLUGIN_ABI_MINOR */
  /* plugin fills: the device type name: lowercase letters, digits and '_' (kiln's backend name,
   * e.g. "npu"); static storage. NULL refuses the plugin, and so does a name without a NUL within
   * 255 bytes (kiln reads no further; the same bound holds for sub_device_type and kernel names). */
  const char* device_type;
  /* plugin fills: a finer name (e.g. "Ascend910"), shown by `kiln devices`; may be NULL */
  const char* sub_device_type;
  /* plugin fills: the plugin's own version */
  uint32_t plugin_version_major;
  uint32_t plugin_version_minor;
  uint32_t plugin_version_patch;
  uint32_t reserved;
  /* plugin fills: the function table, in static storage (kiln copies it) */
  const KilnDeviceInterface* interface;
} KilnPluginParams;

#define KILN_PLUGIN_PARAMS_SIZE KILN_STRUCT_SIZE(KilnPluginParams, interface)

/* Check kiln's version at the top of kiln_device_plugin_init:
 *     KILN_PLUGIN_CHECK_PARAMS(params);
 * returns KILN_STATUS_VERSION_MISMATCH from the entry when kiln's major version differs or its
 * params struct is too small for the fields this header writes. It sets no message; kiln reports
 * the refusal as "the plugin refused this kiln ..." with kiln's own ABI version and params size,
 * and the advice to rebuild the plugin against kiln's header. */
#define KILN_PLUGIN_CHECK_PARAMS(params)                                 \
  do {                                                                   \
    if ((params) == NULL || (params)->abi_major != KILN_PLUGIN_ABI_MAJOR || \
        (params)->struct_size < KILN_PLUGIN_PARAMS_SIZE)                 \
      return KILN_STATUS_VERSION_MISMATCH;                               \
  } while (0)

/* The entry symbol every plugin exports. */
KilnStatus kiln_device_plugin_init(KilnPluginParams* params);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_DEVICE_PLUGIN_H_ */
