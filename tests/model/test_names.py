"""Kernel short names: one rule for the Kineto, rocpd and legacy RPD readers (Nsight states its own)."""

from __future__ import annotations

import duckdb
import pytest

from gpuscope.tools.model.names import create_short_names, short_name

CASES = [
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
     "vectorized_elementwise_kernel"),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>(float*, float const*, int)", "softmax_warp_forward"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, 1>(float*, int)", "CatArrayBatchedCopy"),
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda(float)#1} const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&)::{lambda(int)#1})",
     "elementwise_kernel"),
    ("void at::native::legacy::elementwise_kernel<128, 4, at::native::gpu_kernel_impl<at::native::ceil_kernel_cuda(at::TensorIteratorBase&)::{lambda()#1}> >(int)", "elementwise_kernel"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4::Params)", "Kernel2"),
    ("std::enable_if<(Y<2), void>::type foo::bar<int>(int)", "bar"),
    # A cuBLAS name from the H100 Qwen trace: the old rocpd SQL rule returned 'enable_if' for it.
    ("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float, float, float, float, false, true, true, false, 7, cublasGemvParams<cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float> >(cublasGemvParams<cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float>)",
     "kernel"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"),
    ("Cijk_Ailk_Bljk_HHS_BH_MT128x128x64_MI32x32x8x1_SN_1LDSB0_GRVW8_WG32_8_1_WGM8", "Cijk_Ailk_Bljk_HHS_BH_MT128x128x64_MI32x32x8x1_SN_1LDSB0_GRVW8_WG32_8_1_WGM8"),
    # AMD code-object symbols end in '.kd' (rocpd truncated_kernel_name): not part of the kernel's name.
    ("_Z6kernelPfi.kd", "_Z6kernelPfi"),
    ("__amd_rocclr_copyBuffer.kd", "__amd_rocclr_copyBuffer"),
    ("my_kernel(float*)", "my_kernel"),
    ("Memcpy DtoD (Device -> Device)", "Memcpy DtoD (Device -> Device)"),
    (".kd", ".kd"),
]


@pytest.mark.parametrize("full, short", CASES)
def test_short_name(full, short):
    assert short_name(full) == short


def test_create_short_names_maps_each_distinct_name_once():
    con = duckdb.connect()
    con.execute("CREATE TABLE k AS SELECT * FROM (VALUES (?), (?), (?), (NULL)) t(name)",
                [CASES[0][0], CASES[0][0], "_Z6kernelPfi.kd"])
    create_short_names(con, "names", "SELECT name FROM k")
    assert sorted(con.execute("SELECT name, short FROM names").fetchall()) == sorted(
        [(CASES[0][0], CASES[0][1]), ("_Z6kernelPfi.kd", "_Z6kernelPfi")])
