// One hand-written kernel (symgpu/gpu/runtime/codegen/kernel_text.py: nvcc_kernel): the
// common helpers, then the kernel with the caller's parameters and statements.
${common}
extern "C" __global__ void ${name}(${params})
{
    ${body};
}
