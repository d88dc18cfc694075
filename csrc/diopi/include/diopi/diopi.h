/* DIOPI: the device operator interface between the DIPU shim and a vendor's kernels.
 *
 * The shim describes every tensor with a diopiTensor (data pointer, dtype, shape, strides, and
 * whether the data lives on the device or on the host), allocates every output before the call,
 * and passes a context naming the stream to run on. A vendor exports the functions it
 * implements under the names below; the shim looks each one up at run time and sends an
 * operator to the CPU fallback when the function is absent, or when it returns
 * diopiFallbackToCPU (allowed only before anything was written).
 */
#ifndef DIOPI_H_
#define DIOPI_H_

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DIOPI_ABI_VERSION 1

typedef enum {
  diopiSuccess = 0,
  diopiErrorOccurred = 1, /* the kernel failed; diopiGetLastError() says why */
  diopiDtypeNotSupported = 2,
  diopiFallbackToCPU = 3, /* the vendor declines this call: run it on the CPU instead */
} diopiError_t;

typedef enum {
  diopi_dtype_int8 = 0,
  diopi_dtype_uint8 = 1,
  diopi_dtype_int16 = 2,
  diopi_dtype_int32 = 4,
  diopi_dtype_int64 = 6,
  diopi_dtype_float16 = 8,
  diopi_dtype_float32 = 9,
  diopi_dtype_float64 = 10,
  diopi_dtype_bool = 11,
  diopi_dtype_bfloat16 = 12,
  diopi_dtype_complex64 = 14,
  diopi_dtype_complex128 = 15,
} diopiDtype_t;

typedef enum {
  diopi_device = 0, /* device memory: dereference only through the vendor's own means */
  diopi_host = 1,   /* host memory: a 0-dim scalar operand kept on the host */
} diopiDevice_t;

enum { diopi_tensor_wrapped_number = 1 }; /* a Python number: promotes like a scalar */

typedef struct {
  void* data; /* address of element [0, ..., 0] */
  diopiDtype_t dtype;
  diopiDevice_t device;
  int64_t ndim;
  const int64_t* shape;  /* ndim entries */
  const int64_t* stride; /* ndim entries, in elements */
  uint32_t flags;
} diopiTensor;

typedef diopiTensor* diopiTensorHandle_t;
typedef const diopiTensor* diopiConstTensorHandle_t;

typedef struct {
  diopiDtype_t stype; /* int64 (ival), float64 (fval) or bool (ival 0/1) */
  union {
    double fval;
    int64_t ival;
  };
} diopiScalar_t;

typedef struct {
  const int64_t* data;
  int64_t len; /* -1: argument absent */
} diopiSize_t;

typedef struct {
  void* stream; /* the vendor's dipuStream_t to run on; NULL: default stream */
  int32_t device_index;
} diopiContext;
typedef diopiContext* diopiContextHandle_t;

/* Text of the last error on the calling thread, for diopiErrorOccurred. */
const char* diopiGetLastError(void);

/* ---- Operators. Outputs come first, then inputs, then attributes. ---- */

/* Linear algebra */
diopiError_t diopiMm(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                     diopiConstTensorHandle_t mat2);
diopiError_t diopiBmm(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiConstTensorHandle_t mat2);
diopiError_t diopiAddmm(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                        diopiConstTensorHandle_t mat1, diopiConstTensorHandle_t mat2, const diopiScalar_t* beta,
                        const diopiScalar_t* alpha);

/* Element-wise */
diopiError_t diopiAdd(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiConstTensorHandle_t other, const diopiScalar_t* alpha);
diopiError_t diopiAddInp(diopiContextHandle_t ctx, diopiTensorHandle_t input, diopiConstTensorHandle_t other,
                         const diopiScalar_t* alpha);
diopiError_t diopiSub(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiConstTensorHandle_t other, const diopiScalar_t* alpha);
diopiError_t diopiMul(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiConstTensorHandle_t other);
diopiError_t diopiMulInp(diopiContextHandle_t ctx, diopiTensorHandle_t input, diopiConstTensorHandle_t other);
diopiError_t diopiDiv(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiConstTensorHandle_t other);
diopiError_t diopiDivInp(diopiContextHandle_t ctx, diopiTensorHandle_t input, diopiConstTensorHandle_t other);
diopiError_t diopiNeg(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input);
diopiError_t diopiPowTensorScalar(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                                  const diopiScalar_t* exponent);
diopiError_t diopiRsqrt(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input);
diopiError_t diopiSqrt(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input);
diopiError_t diopiExp(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input);
diopiError_t diopiWhere(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t condition,
                        diopiConstTensorHandle_t input, diopiConstTensorHandle_t other);
diopiError_t diopiMaskedFillInp(diopiContextHandle_t ctx, diopiTensorHandle_t input, diopiConstTensorHandle_t mask,
                                const diopiScalar_t* value);
diopiError_t diopiFill(diopiContextHandle_t ctx, diopiTensorHandle_t input, const diopiScalar_t* value);
diopiError_t diopiAddcmul(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                          diopiConstTensorHandle_t tensor1, diopiConstTensorHandle_t tensor2,
                          const diopiScalar_t* value);
diopiError_t diopiAddcdiv(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                          diopiConstTensorHandle_t tensor1, diopiConstTensorHandle_t tensor2,
                          const diopiScalar_t* value);
diopiError_t diopiLerpScalar(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                             diopiConstTensorHandle_t end, const diopiScalar_t* weight);
/* dest[...] = src[...], broadcasting src and converting its dtype. */
diopiError_t diopiCopyInp(diopiContextHandle_t ctx, diopiConstTensorHandle_t src, diopiTensorHandle_t dest);

/* Activations */
diopiError_t diopiSilu(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input);
diopiError_t diopiSiluBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                               diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input);
diopiError_t diopiSoftmax(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                          int64_t dim);
diopiError_t diopiSoftmaxBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                  diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t output, int64_t dim);
diopiError_t diopiLogSoftmax(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                             int64_t dim);
diopiError_t diopiLogSoftmaxBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                     diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t output,
                                     int64_t dim);

/* Reductions (dim.len == -1: all dimensions) */
diopiError_t diopiSum(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiSize_t dim, bool keepdim);
diopiError_t diopiMean(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                       diopiSize_t dim, bool keepdim);

/* Indexing and shape */
diopiError_t diopiIndexSelect(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                              int64_t dim, diopiConstTensorHandle_t index);
diopiError_t diopiCat(diopiContextHandle_t ctx, diopiTensorHandle_t out, const diopiConstTensorHandle_t* tensors,
                      int64_t num_tensors, int64_t dim);
diopiError_t diopiEmbeddingBackward(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t grad,
                                    diopiConstTensorHandle_t indices, int64_t num_weights, int64_t padding_idx,
                                    bool scale_grad_by_freq);

/* Losses (reduction: 0 none, 1 mean, 2 sum) */
diopiError_t diopiNLLLoss(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiTensorHandle_t total_weight,
                          diopiConstTensorHandle_t input, diopiConstTensorHandle_t target,
                          diopiConstTensorHandle_t weight, int64_t reduction, int64_t ignore_index);
diopiError_t diopiNLLLossBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                  diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                                  diopiConstTensorHandle_t target, diopiConstTensorHandle_t weight, int64_t reduction,
                                  int64_t ignore_index, diopiConstTensorHandle_t total_weight);

/* Attention (query/key/value: batch, heads, seq, head_dim; scale NULL: 1/sqrt(head_dim)) */
diopiError_t diopiFlashAttention(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiTensorHandle_t logsumexp,
                                 diopiConstTensorHandle_t query, diopiConstTensorHandle_t key,
                                 diopiConstTensorHandle_t value, double dropout_p, bool is_causal,
                                 diopiConstTensorHandle_t attn_mask, const double* scale);
diopiError_t diopiFlashAttentionBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_query,
                                         diopiTensorHandle_t grad_key, diopiTensorHandle_t grad_value,
                                         diopiConstTensorHandle_t grad_out, diopiConstTensorHandle_t query,
                                         diopiConstTensorHandle_t key, diopiConstTensorHandle_t value,
                                         diopiConstTensorHandle_t out, diopiConstTensorHandle_t logsumexp,
                                         double dropout_p, bool is_causal, diopiConstTensorHandle_t attn_mask,
                                         const double* scale);

/* Activations (grad_output-first backward functions take the forward's input, or its output where
 * named so) */
diopiError_t diopiRelu(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input);
diopiError_t diopiReluInp(diopiContextHandle_t ctx, diopiTensorHandle_t input);
diopiError_t diopiThresholdBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                    diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                                    const diopiScalar_t* threshold);
/* approximate: "none" (erf) or "tanh" */
diopiError_t diopiGelu(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                       const char* approximate);
diopiError_t diopiGeluBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                               diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                               const char* approximate);
diopiError_t diopiTanh(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input);
diopiError_t diopiTanhBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                               diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t output);
diopiError_t diopiSigmoid(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input);
diopiError_t diopiSigmoidBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                  diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t output);

/* Normalization. Backward outputs may be NULL: the caller does not need that gradient. */
diopiError_t diopiLayerNorm(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiTensorHandle_t save_mean,
                            diopiTensorHandle_t save_invstd, diopiConstTensorHandle_t input,
                            diopiConstTensorHandle_t weight, diopiConstTensorHandle_t bias,
                            diopiSize_t normalized_shape, double eps);
diopiError_t diopiLayerNormBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                    diopiTensorHandle_t grad_weight, diopiTensorHandle_t grad_bias,
                                    diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                                    diopiConstTensorHandle_t mean, diopiConstTensorHandle_t rstd,
                                    diopiConstTensorHandle_t weight, diopiConstTensorHandle_t bias,
                                    diopiSize_t normalized_shape);
/* input: N, C, ... with C split into `group` groups; mean/rstd: N x group */
diopiError_t diopiGroupNorm(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiTensorHandle_t save_mean,
                            diopiTensorHandle_t save_rstd, diopiConstTensorHandle_t input,
                            diopiConstTensorHandle_t weight, diopiConstTensorHandle_t bias, int64_t group, double eps);
diopiError_t diopiGroupNormBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                    diopiTensorHandle_t grad_weight, diopiTensorHandle_t grad_bias,
                                    diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                                    diopiConstTensorHandle_t mean, diopiConstTensorHandle_t rstd,
                                    diopiConstTensorHandle_t weight, int64_t group);
/* training: batch statistics, and running_mean/running_var (when given) are updated in place with
 * momentum; otherwise the running statistics normalize. */
diopiError_t diopiBatchNorm(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiTensorHandle_t save_mean,
                            diopiTensorHandle_t save_invstd, diopiConstTensorHandle_t input,
                            diopiConstTensorHandle_t weight, diopiConstTensorHandle_t bias,
                            diopiConstTensorHandle_t running_mean, diopiConstTensorHandle_t running_var, bool training,
                            double momentum, double eps);
diopiError_t diopiBatchNormBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                    diopiTensorHandle_t grad_weight, diopiTensorHandle_t grad_bias,
                                    diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                                    diopiConstTensorHandle_t weight, diopiConstTensorHandle_t running_mean,
                                    diopiConstTensorHandle_t running_var, diopiConstTensorHandle_t save_mean,
                                    diopiConstTensorHandle_t save_invstd, bool training, double eps);

/* Convolution, 1-3 spatial dimensions, direct or transposed (weight: out, in/groups, k... when direct;
 * in, out/groups, k... when transposed). Backward outputs may be NULL. */
diopiError_t diopiConvolution(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                              diopiConstTensorHandle_t weight, diopiConstTensorHandle_t bias, diopiSize_t stride,
                              diopiSize_t padding, diopiSize_t dilation, bool transposed, diopiSize_t output_padding,
                              int64_t groups);
diopiError_t diopiConvolutionBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                      diopiTensorHandle_t grad_weight, diopiTensorHandle_t grad_bias,
                                      diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                                      diopiConstTensorHandle_t weight, diopiSize_t stride, diopiSize_t padding,
                                      diopiSize_t dilation, bool transposed, diopiSize_t output_padding,
                                      int64_t groups);

/* Pooling (indices: int64 positions within each plane) */
diopiError_t diopiMaxPool2dWithIndices(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiTensorHandle_t indices,
                                       diopiConstTensorHandle_t input, diopiSize_t kernel_size, diopiSize_t stride,
                                       diopiSize_t padding, diopiSize_t dilation, bool ceil_mode);
diopiError_t diopiMaxPool2dWithIndicesBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                               diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                                               diopiSize_t kernel_size, diopiSize_t stride, diopiSize_t padding,
                                               diopiSize_t dilation, bool ceil_mode, diopiConstTensorHandle_t indices);
diopiError_t diopiAdaptiveAvgPool2d(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                                    diopiSize_t output_size);
diopiError_t diopiAdaptiveAvgPool2dBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                            diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input);

/* Recurrent cells (rows: batch; gates: 4 hidden-sized blocks i, f, g, o for LSTM, 3 blocks r, z, n
 * for GRU). input_gates and hidden_gates are the two matrix products; the biases (both NULL or both
 * given) are added here. The workspace keeps what the backward needs: LSTM the four activated gates
 * (rows x 4H), GRU r, z, n, hx and the hidden n-gate with its bias (rows x 5H). */
diopiError_t diopiLstmCell(diopiContextHandle_t ctx, diopiTensorHandle_t hy, diopiTensorHandle_t cy,
                           diopiTensorHandle_t workspace, diopiConstTensorHandle_t input_gates,
                           diopiConstTensorHandle_t hidden_gates, diopiConstTensorHandle_t cx,
                           diopiConstTensorHandle_t input_bias, diopiConstTensorHandle_t hidden_bias);
/* grad_hy or grad_cy may be NULL (zero); grad_bias may be NULL (no bias). */
diopiError_t diopiLstmCellBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_gates,
                                   diopiTensorHandle_t grad_cx, diopiTensorHandle_t grad_bias,
                                   diopiConstTensorHandle_t grad_hy, diopiConstTensorHandle_t grad_cy,
                                   diopiConstTensorHandle_t cx, diopiConstTensorHandle_t cy,
                                   diopiConstTensorHandle_t workspace);
diopiError_t diopiGruCell(diopiContextHandle_t ctx, diopiTensorHandle_t hy, diopiTensorHandle_t workspace,
                          diopiConstTensorHandle_t input_gates, diopiConstTensorHandle_t hidden_gates,
                          diopiConstTensorHandle_t hx, diopiConstTensorHandle_t input_bias,
                          diopiConstTensorHandle_t hidden_bias);
/* grad_input_bias and grad_hidden_bias may be NULL (no bias). */
diopiError_t diopiGruCellBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input_gates,
                                  diopiTensorHandle_t grad_hidden_gates, diopiTensorHandle_t grad_hx,
                                  diopiTensorHandle_t grad_input_bias, diopiTensorHandle_t grad_hidden_bias,
                                  diopiConstTensorHandle_t grad_hy, diopiConstTensorHandle_t workspace);

/* Mean squared error (reduction: 0 none, 1 mean, 2 sum) */
diopiError_t diopiMSELoss(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                          diopiConstTensorHandle_t target, int64_t reduction);
diopiError_t diopiMSELossBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                  diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                                  diopiConstTensorHandle_t target, int64_t reduction);

/* Dropout backward: grad_output * mask * scale */
diopiError_t diopiDropoutBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                  diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t mask, double scale);

/* Logical reductions and tests (out: bool; dim.len == -1: all dimensions) */
diopiError_t diopiAll(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiSize_t dim, bool keepdim);
diopiError_t diopiIsNegInf(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input);

#ifdef __cplusplus
}
#endif

#endif /* DIOPI_H_ */
