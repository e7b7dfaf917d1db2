-- gpuscope trace model: the relations every reader fills and every tool (and sql_query) reads.
-- One schema for Nsight Systems SQLite exports, rocpd databases and PyTorch profiler traces.
-- Conventions:
--   * every time is BIGINT nanoseconds on the profile's own timeline (Nsight: session-relative, may
--     be negative; rocpd: ROCprofiler clock; Kineto: trace timestamps converted with round(us*1000));
--   * intervals are [start_ns, end_ns); dur_ns = end_ns - start_ns (>= 0);
--   * pid/tid are operating-system ids; NULL means "the profile does not say";
--   * names are resolved to text; nothing is left as a string id.

-- One row per fact about the capture (format, versions, spans, ...). Keys are documented in
-- docs/trace-model.md.
CREATE TABLE trace_meta (
    key VARCHAR NOT NULL,            -- fact name, e.g. 'format', 'format_version', 'capture_start_ns'
    value VARCHAR                    -- fact value as text
);

-- GPUs (and other adapters the profile lists). device_id is the id used by kernels/memops rows.
CREATE TABLE devices (
    device_id INTEGER NOT NULL,          -- id used by activity rows (Nsight deviceId, rocpd GPU ordinal, Kineto device index)
    name VARCHAR,                        -- marketing name as the profile writes it
    vendor VARCHAR,                      -- 'NVIDIA', 'AMD', 'Intel', ... or NULL
    is_compute BOOLEAN,                  -- true when the device can run CUDA/HIP work (false: listed display adapters)
    sm_count INTEGER,                    -- streaming multiprocessors (NVIDIA) or compute units (AMD)
    memory_bytes BIGINT,                 -- device memory size in bytes
    memory_bandwidth_bytes_per_s BIGINT, -- peak DRAM bandwidth in bytes/s when the profile states it
    clock_hz BIGINT,                     -- peak SM/engine clock in Hz
    compute_capability VARCHAR,          -- 'major.minor' (NVIDIA) or gfx target (AMD)
    warp_size INTEGER,                   -- threads per warp / wavefront
    bus_location VARCHAR                 -- PCI bus id when known
);

-- Processes (ranks) that appear in the profile.
CREATE TABLE processes (
    pid BIGINT NOT NULL,             -- OS process id
    name VARCHAR,                    -- process / command name
    rank INTEGER,                    -- distributed rank when the profile states it
    hostname VARCHAR                 -- host name when known
);

-- Host threads with their names.
CREATE TABLE threads (
    pid BIGINT NOT NULL,             -- OS process id
    tid BIGINT NOT NULL,             -- OS thread id
    name VARCHAR                     -- thread name when known
);

-- GPU kernel executions.
CREATE TABLE kernels (
    device_id INTEGER NOT NULL,      -- GPU that ran the kernel (devices.device_id)
    stream_id BIGINT,                -- stream (CUDA stream / HIP stream or queue) on that device
    start_ns BIGINT NOT NULL,        -- GPU start time, ns
    end_ns BIGINT NOT NULL,          -- GPU end time, ns
    dur_ns BIGINT NOT NULL,          -- end_ns - start_ns, ns
    name VARCHAR NOT NULL,           -- full (demangled) kernel name
    short_name VARCHAR NOT NULL,     -- base name without template arguments / parameters
    grid_x INTEGER, grid_y INTEGER, grid_z INTEGER,     -- grid size in blocks (workgroups on AMD)
    block_x INTEGER, block_y INTEGER, block_z INTEGER,  -- block size in threads (workgroup size on AMD)
    registers_per_thread INTEGER,    -- registers (VGPRs on AMD) per thread
    static_shared_bytes BIGINT,      -- static shared memory (LDS) per block, bytes
    dynamic_shared_bytes BIGINT,     -- dynamic shared memory per block, bytes
    correlation_id BIGINT,           -- id linking the kernel to its launching API call (per process)
    graph_id BIGINT,                 -- CUDA/HIP graph the kernel belongs to, when known
    pid BIGINT,                      -- process that owns the work
    tid BIGINT,                      -- thread that launched it (NULL when the launch is not in the profile)
    launched BOOLEAN NOT NULL,       -- true when the launching API call is in the profile
    whole_graph BOOLEAN NOT NULL DEFAULT false, -- true: the row is one whole CUDA graph execution, not a kernel (Nsight --cuda-graph-trace=graph, the default, records graph launches in CUPTI_ACTIVITY_KIND_GRAPH_TRACE without the kernels inside); name 'CUDA graph <graph_id>', no launch configuration
    communicator VARCHAR,            -- communicator of a communication kernel as the profile records it, else NULL: Nsight, the NCCL payload's communicator id (nccl_calls.comm_id) of the one NCCL call that launched the kernel; Kineto, the kernel args' 'Process Group Name'; rocpd/rpd: never (RCCL API records are not linked to kernels)
    collective VARCHAR               -- operation of a communication kernel as the profile records it, else NULL: Nsight, that NCCL call's name without 'nccl' ('AllReduce', 'Send'); Kineto, the kernel args' 'Collective name' ('allreduce', 'send'); rocpd/rpd: never (RCCL API records are not linked to kernels)
);

-- GPU memory copies and memory sets.
CREATE TABLE memops (
    device_id INTEGER NOT NULL,      -- GPU whose engine executed the operation
    stream_id BIGINT,                -- stream on that device
    start_ns BIGINT NOT NULL,        -- GPU start time, ns
    end_ns BIGINT NOT NULL,          -- GPU end time, ns
    dur_ns BIGINT NOT NULL,          -- end_ns - start_ns, ns
    op VARCHAR NOT NULL,             -- 'copy' or 'set'
    kind VARCHAR NOT NULL,           -- copies: 'HtoD','DtoH','DtoD','HtoH','PtoP','HtoA','AtoH','AtoA','AtoD','DtoA','Unknown'; sets: 'memset'
    bytes BIGINT,                    -- bytes copied or set
    src_kind VARCHAR,                -- source memory kind: 'Pageable','Pinned','Device','Array','Managed',... (copies)
    dst_kind VARCHAR,                -- destination memory kind (copies; for sets the memory set)
    src_device_id INTEGER,           -- source device for peer copies
    dst_device_id INTEGER,           -- destination device for peer copies
    correlation_id BIGINT,           -- id linking the op to its API call (per process)
    pid BIGINT,                      -- process that owns the work
    tid BIGINT,                      -- thread that issued it (NULL when the API call is not in the profile)
    launched BOOLEAN NOT NULL        -- true when the issuing API call is in the profile
);

-- Host-side runtime/driver API calls (CUDA runtime and driver, HIP, HSA).
CREATE TABLE api_calls (
    pid BIGINT,                      -- OS process id
    tid BIGINT,                      -- OS thread id
    start_ns BIGINT NOT NULL,        -- call entry, ns
    end_ns BIGINT NOT NULL,          -- call return, ns
    dur_ns BIGINT NOT NULL,          -- end_ns - start_ns, ns
    name VARCHAR NOT NULL,           -- API name with version suffix folded ('cudaLaunchKernel', not 'cudaLaunchKernel_v7000')
    api VARCHAR NOT NULL,            -- 'cuda_runtime', 'cuda_driver', 'hip', 'hsa', 'rccl', ...
    correlation_id BIGINT,           -- id shared with the GPU work this call launched (per process)
    external_id BIGINT,              -- PyTorch External id of the CPU op that issued the call (Kineto only)
    event_id BIGINT                  -- CUDA event a cudaEventRecord / cudaStreamWaitEvent / cudaEventSynchronize call names
                                     -- (per process; Nsight: CUDA_EVENT and SYNCHRONIZATION eventId; Kineto: the correlation id of
                                     -- the recording cudaEventRecord, from cuda_sync records), else NULL
);

-- Annotations: NVTX ranges/marks, rocTX, PyTorch record_function / ProfilerStep annotations.
CREATE TABLE markers (
    pid BIGINT,                      -- OS process id (NULL for GPU-side projections)
    tid BIGINT,                      -- OS thread id
    start_ns BIGINT NOT NULL,        -- range start (or mark time), ns
    end_ns BIGINT NOT NULL,          -- range end (= start for marks and unterminated ranges), ns
    dur_ns BIGINT NOT NULL,          -- end_ns - start_ns, ns
    name VARCHAR NOT NULL,           -- annotation text
    domain VARCHAR,                  -- NVTX domain / marker category ('' = default domain)
    kind VARCHAR NOT NULL,           -- 'push_pop', 'start_end', 'mark', 'annotation' (PyTorch), 'gpu_annotation'
    source VARCHAR NOT NULL,         -- 'nvtx', 'roctx', 'pytorch'
    device_id INTEGER,               -- set for GPU-side annotations (PyTorch gpu_user_annotation)
    stream_id BIGINT                 -- stream of a GPU-side annotation
);

-- PyTorch CPU operators and Python frames (empty for Nsight and rocpd).
CREATE TABLE cpu_ops (
    pid BIGINT,                      -- OS process id
    tid BIGINT,                      -- OS thread id
    start_ns BIGINT NOT NULL,        -- op start, ns
    end_ns BIGINT NOT NULL,          -- op end, ns
    dur_ns BIGINT NOT NULL,          -- end_ns - start_ns, ns
    name VARCHAR NOT NULL,           -- operator name, e.g. 'aten::mm'
    category VARCHAR NOT NULL,       -- 'cpu_op' or 'python_function'
    external_id BIGINT,              -- PyTorch External id (links to the runtime calls it issued)
    sequence_number BIGINT,          -- autograd sequence number
    input_dims VARCHAR,              -- JSON list of input shapes
    input_types VARCHAR,             -- JSON list of input dtypes
    input_strides VARCHAR,           -- JSON list of input strides
    concrete_inputs VARCHAR,         -- JSON list of scalar inputs
    args VARCHAR                     -- all other args as a JSON object
);

-- NCCL API calls whose NVTX range carries an NCCL payload (Nsight exports of NCCL >= 2.19 with blobs included:
-- NVTX_EVENTS.binaryData decoded with NVTX_PAYLOAD_SCHEMA_ENTRIES). One row per range; payload fields are as
-- NCCL wrote them, NULL when the call's schema has no such field. Ranges whose payload cannot be decoded are
-- counted in data_issues. The kernel columns name the one kernel launched from inside the range, if exactly one.
CREATE TABLE nccl_calls (
    pid BIGINT,                      -- OS process id
    tid BIGINT,                      -- OS thread id
    start_ns BIGINT NOT NULL,        -- NVTX range start (host side), ns
    end_ns BIGINT NOT NULL,          -- NVTX range end (host side), ns
    dur_ns BIGINT NOT NULL,          -- end_ns - start_ns: host time in the NCCL call (enqueue, not transfer), ns
    name VARCHAR NOT NULL,           -- NCCL API name, e.g. 'ncclAllReduce', 'ncclCommInitRankConfig'
    schema_id BIGINT NOT NULL,       -- NVTX payload schema id (NCCL static ids: 16777216 + NVTX_SID_*)
    comm_id VARCHAR,                 -- 'NCCL communicator ID' (commHash) as hex text, e.g. '0x5a1c...'; NULL before NCCL 2.25
    bytes BIGINT,                    -- 'Message size [bytes]' ('Bytes' before 2.25): count x type size, per rank for AllGather, ReduceScatter, AlltoAll, Gather, Scatter
    nranks INTEGER,                  -- 'No. of ranks' of the communicator (communicator init/destroy/split calls only)
    rank INTEGER,                    -- 'Rank' of this process in the communicator (communicator calls only)
    cuda_device INTEGER,             -- 'CUDA device' ordinal (communicator calls only)
    peer INTEGER,                    -- 'Peer rank' (ncclSend / ncclRecv)
    root INTEGER,                    -- 'Root' rank (broadcast, reduce, gather, scatter)
    reduce_op VARCHAR,               -- 'Reduction operation' (Sum, Product, Max, Min, Avg; the number when the export lists no names)
    kernels_launched INTEGER NOT NULL, -- kernels launched by API calls of this thread inside the range
    device_id INTEGER,               -- device of the launched kernel (when kernels_launched = 1)
    stream_id BIGINT,                -- stream of the launched kernel (when kernels_launched = 1)
    kernel_start_ns BIGINT,          -- GPU start of the launched kernel (when kernels_launched = 1), ns
    kernel_end_ns BIGINT             -- GPU end of the launched kernel (when kernels_launched = 1), ns
);

-- Device (and host) memory allocations and frees, one row per allocator event: PyTorch profile_memory=True
-- ('[memory]' instant events), Nsight --cuda-memory-usage=true (CUDA_GPU_MEMORY_USAGE_EVENTS), rocprofv3
-- --memory-allocation-trace (rocpd_memory_allocate). Events at equal ts_ns keep the profile's order (rowid).
CREATE TABLE memory_events (
    device_id INTEGER,               -- GPU whose memory it is (devices.device_id); NULL for host memory
    memory_kind VARCHAR NOT NULL,    -- 'Device', 'Device Static', 'Managed', 'Pinned', 'Pageable', 'Host', 'Scratch', 'Virtual', 'Unknown'
    pid BIGINT,                      -- OS process id
    tid BIGINT,                      -- OS thread that allocated or freed (NULL when the profile does not say)
    ts_ns BIGINT NOT NULL,           -- time of the event, ns
    bytes BIGINT NOT NULL,           -- signed size: > 0 allocated, < 0 freed, bytes
    addr BIGINT,                     -- address of the block (pairs a free with its allocation), NULL when not recorded
    total_allocated_bytes BIGINT,    -- allocator's allocated total on this device after the event, when the profile states it (Kineto), bytes
    total_reserved_bytes BIGINT,     -- reserved total after the event, bytes, when the profile states it: the caching allocator's (Kineto 'Total Reserved'), or the sum of the device's CUDA memory-pool sizes (Nsight, carried forward from the last row stating a pool size)
    kind VARCHAR NOT NULL,           -- 'alloc', 'free', or 'pool' (Nsight CUDA_GPU_MEMORY_POOL_EVENTS: a pool created, trimmed or destroyed; bytes 0, site names the operation)
    site VARCHAR,                    -- where it was allocated or freed: innermost enclosing cpu_op on the thread (Kineto), the API call by correlation id or the variable name (Nsight), the HIP call (rocpd); NULL when unknown
    correlation_id BIGINT            -- id of the API call that made it (Nsight correlationId, rocpd stack id), NULL when not recorded
);

-- GPU memory levels the operating system reports per process: the Windows (WDDM) video memory manager's
-- VidMmProcessUsageChange / VidMmProcessBudgetChange events, Nsight GPU_MEMORY_USAGE_EVENTS / GPU_MEMORY_BUDGET_EVENTS
-- (Nsight Systems on Windows). Each row is a process's new level from ts_ns on, not a change. Usage is all the video
-- memory the OS counts for the process in that segment group (CUDA context, allocator pools, driver and graphics
-- allocations), not allocator live bytes; the export lists every process on the adapter, not only the profiled ones.
-- Events at one ts_ns keep the profile's order (rowid).
CREATE TABLE os_memory_levels (
    device_id INTEGER NOT NULL,      -- adapter the level is for (Nsight `gpu` index, = TARGET_INFO_GPU id = devices.device_id)
    pid BIGINT,                      -- process the level belongs to (Nsight names the System process, pid 4, on the budget rows of its start and end rundown)
    ts_ns BIGINT NOT NULL,           -- time the OS reported the new level, ns
    metric VARCHAR NOT NULL,         -- 'usage' (VidMmProcessUsageChange) or 'budget' (VidMmProcessBudgetChange: what the OS lets the process keep resident)
    segment_group VARCHAR NOT NULL,  -- 'local' (DXGI segment group 0: the adapter's own memory), 'non-local' (1: system memory the GPU reaches), else 'segment group <n>'
    bytes BIGINT NOT NULL            -- the new level, bytes
);

-- Source rows a reader (or the model check) left out of a model table or kept with a corrected value, and rows of the
-- profile's own tables whose cells a sqlite3 copy had to change (invalid UTF-8, a value its declared type cannot hold).
-- One row per (table, action, reason); empty when every source row was used as written.
CREATE TABLE data_issues (
    table_name VARCHAR NOT NULL,     -- model table the source rows belong to, e.g. 'kernels', or a native table, e.g. 'native."NVTX_EVENTS"'
    action VARCHAR NOT NULL,         -- 'skipped' (left out of the table) or 'repaired' (kept with a corrected value)
    rows BIGINT NOT NULL,            -- number of source rows, > 0
    reason VARCHAR NOT NULL          -- what was wrong and what was done, e.g. 'ts is not a finite number'
);
