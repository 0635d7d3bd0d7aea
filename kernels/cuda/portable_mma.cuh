// Prepended to the _portable variants of the tensor-core modules: their mma, ldmatrix and
// cp.async go through the portable emulation in mma.cuh, the path hipRTC compiles, so that path
// can be run and checked on NVIDIA devices too.
#define KILN_PORTABLE_MMA 1
