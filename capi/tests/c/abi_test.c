/* A C program against include/kiln.h: the tiny preset's prefill through the ABI, and every
 * kind of bad call answered with its status and a message instead of a crash.
 *
 * Usage: abi_test OUT_FILE
 * Writes the prefill logits of the tokens below (f32, native byte order) to OUT_FILE for
 * tests/c_abi.rs to compare bit for bit; prints "N passed, N failed" and exits non-zero on a
 * failure. */

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "kiln.h"

static int passed = 0;
static int failed = 0;

static void expect(const char *what, KilnStatus got, KilnStatus want) {
    const char *message = kiln_last_error();
    if (got == want) {
        passed++;
        if (want != KILN_STATUS_OK && (message == NULL || message[0] == '\0')) {
            printf("FAIL %s: status %d but no message\n", what, (int)got);
            failed++;
        }
    } else {
        printf("FAIL %s: status %d, expected %d (%s)\n", what, (int)got, (int)want,
               message ? message : "(null)");
        failed++;
    }
}

static KilnTensor host(void *data, uint64_t bytes, uint32_t rank, const int64_t *shape,
                       const int64_t *strides, KilnDType dtype) {
    KilnTensor tensor;
    tensor.data = data;
    tensor.accessible_bytes = bytes;
    tensor.rank = rank;
    tensor.shape = shape;
    tensor.strides = strides;
    tensor.dtype = dtype;
    tensor.device.device_type = KILN_DEVICE_CPU;
    tensor.device.index = 0;
    return tensor;
}

/* A handle serves the thread that made it: another thread gets KILN_STATUS_INVALID_HANDLE,
 * and the message is that thread's own. */
static KilnStatus foreign_status = KILN_STATUS_OK;
static int foreign_message = 0;

static void *run_elsewhere(void *program) {
    KilnStream sync = {{KILN_DEVICE_CPU, 0}, NULL};
    foreign_status = kiln_program_run(*(KilnProgram *)program, sync);
    foreign_message = kiln_last_error()[0] != '\0';
    return NULL;
}

#define SEQ 8
#define VOCAB 97

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: abi_test OUT_FILE\n");
        return 2;
    }
    KilnDevice cpu = {KILN_DEVICE_CPU, 0};
    KilnStream sync = {{KILN_DEVICE_CPU, 0}, NULL};

    /* Versions. */
    expect("abi version", kiln_abi_version() == KILN_ABI_VERSION ? 0 : 1, KILN_STATUS_OK);
    expect("version string", strlen(kiln_version()) > 0 ? 0 : 1, KILN_STATUS_OK);

    /* Loading. */
    KilnModel model = {0};
    expect("load null model", kiln_model_load(NULL, cpu, "f32", 0, &model),
           KILN_STATUS_NULL_POINTER);
    expect("load null out", kiln_model_load("tiny", cpu, "f32", 0, NULL),
           KILN_STATUS_NULL_POINTER);
    expect("load unknown model", kiln_model_load("no-such-model", cpu, "f32", 0, &model),
           KILN_STATUS_NOT_FOUND);
    expect("load bad precision", kiln_model_load("tiny", cpu, "f8", 0, &model),
           KILN_STATUS_INVALID_ARGUMENT);
    KilnDevice odd = {77, 3};
    expect("load bad device", kiln_model_load("tiny", odd, "f32", 0, &model),
           KILN_STATUS_DEVICE);
    expect("nothing written on failure", model.id == 0 ? 0 : 1, KILN_STATUS_OK);
    expect("load tiny", kiln_model_load("tiny", cpu, "f32", 0, &model), KILN_STATUS_OK);

    /* Compiling. */
    KilnProgramOptions options = {1, SEQ, 0, 1, 0};
    KilnProgram prefill = {0};
    expect("compile unknown program", kiln_program_compile(model, "sample", &options, &prefill),
           KILN_STATUS_INVALID_ARGUMENT);
    expect("compile null options", kiln_program_compile(model, "prefill", NULL, &prefill),
           KILN_STATUS_NULL_POINTER);
    KilnProgramOptions too_long = {1, 100000, 0, 1, 0};
    expect("compile seq beyond positions",
           kiln_program_compile(model, "prefill", &too_long, &prefill),
           KILN_STATUS_INVALID_ARGUMENT);
    KilnProgramOptions bad_flag = {1, SEQ, 0, 7, 0};
    expect("compile bad flag", kiln_program_compile(model, "prefill", &bad_flag, &prefill),
           KILN_STATUS_INVALID_ARGUMENT);
    expect("compile prefill", kiln_program_compile(model, "prefill", &options, &prefill),
           KILN_STATUS_OK);

    /* A run before its inputs are set fails. */
    expect("run unset inputs", kiln_program_run(prefill, sync), KILN_STATUS_FAILED);

    /* Inputs. */
    int64_t tokens[SEQ] = {1, 5, 9, 2, 70, 3, 3, 8};
    int64_t positions[SEQ];
    for (int i = 0; i < SEQ; i++) positions[i] = i;
    int64_t cache_positions[1] = {0};
    int64_t row[2] = {1, SEQ};
    int64_t one[1] = {1};
    KilnTensor t = host(tokens, sizeof tokens, 2, row, NULL, KILN_DTYPE_I64);

    float as_float[SEQ] = {0};
    KilnTensor wrong_dtype = host(as_float, sizeof as_float, 2, row, NULL, KILN_DTYPE_F32);
    expect("input wrong dtype", kiln_program_set_input(prefill, "tokens", &wrong_dtype, sync),
           KILN_STATUS_DTYPE);
    KilnTensor bad_code = host(tokens, sizeof tokens, 2, row, NULL, 99);
    expect("input unknown dtype code",
           kiln_program_set_input(prefill, "tokens", &bad_code, sync), KILN_STATUS_DTYPE);
    int64_t short_row[2] = {1, SEQ - 1};
    KilnTensor wrong_shape = host(tokens, sizeof tokens, 2, short_row, NULL, KILN_DTYPE_I64);
    expect("input wrong shape", kiln_program_set_input(prefill, "tokens", &wrong_shape, sync),
           KILN_STATUS_SHAPE);
    KilnTensor too_few_bytes = host(tokens, sizeof tokens - 8, 2, row, NULL, KILN_DTYPE_I64);
    expect("input past its bytes",
           kiln_program_set_input(prefill, "tokens", &too_few_bytes, sync), KILN_STATUS_SHAPE);
    int64_t negative[2] = {1, -8};
    KilnTensor negative_dim = host(tokens, sizeof tokens, 2, negative, NULL, KILN_DTYPE_I64);
    expect("input negative dim",
           kiln_program_set_input(prefill, "tokens", &negative_dim, sync), KILN_STATUS_SHAPE);
    KilnTensor huge_rank = host(tokens, sizeof tokens, 1000, row, NULL, KILN_DTYPE_I64);
    expect("input huge rank", kiln_program_set_input(prefill, "tokens", &huge_rank, sync),
           KILN_STATUS_SHAPE);
    KilnTensor null_data = host(NULL, sizeof tokens, 2, row, NULL, KILN_DTYPE_I64);
    expect("input null data", kiln_program_set_input(prefill, "tokens", &null_data, sync),
           KILN_STATUS_NULL_POINTER);
    KilnTensor null_shape = host(tokens, sizeof tokens, 2, NULL, NULL, KILN_DTYPE_I64);
    expect("input null shape", kiln_program_set_input(prefill, "tokens", &null_shape, sync),
           KILN_STATUS_NULL_POINTER);
    expect("input null descriptor", kiln_program_set_input(prefill, "tokens", NULL, sync),
           KILN_STATUS_NULL_POINTER);
    expect("input null name", kiln_program_set_input(prefill, NULL, &t, sync),
           KILN_STATUS_NULL_POINTER);
    expect("input unknown name", kiln_program_set_input(prefill, "token_ids", &t, sync),
           KILN_STATUS_NOT_FOUND);
    KilnTensor on_cuda = t;
    on_cuda.device.device_type = KILN_DEVICE_CUDA;
    expect("input on cuda", kiln_program_set_input(prefill, "tokens", &on_cuda, sync),
           KILN_STATUS_DEVICE);
    int dummy_stream = 0;
    KilnStream foreign = {{KILN_DEVICE_CPU, 0}, &dummy_stream};
    expect("input foreign stream", kiln_program_set_input(prefill, "tokens", &t, foreign),
           KILN_STATUS_DEVICE);
    int64_t bad_ids[SEQ] = {1, 5, 9, 2, 97, 3, 3, 8};
    KilnTensor out_of_vocab = host(bad_ids, sizeof bad_ids, 2, row, NULL, KILN_DTYPE_I64);
    expect("input id outside the vocabulary",
           kiln_program_set_input(prefill, "tokens", &out_of_vocab, sync),
           KILN_STATUS_INVALID_ARGUMENT);

    /* The same tokens read through strides: every other element of a wider buffer. */
    int64_t spread[2 * SEQ];
    for (int i = 0; i < SEQ; i++) {
        spread[2 * i] = tokens[i];
        spread[2 * i + 1] = -1;
    }
    int64_t spread_strides[2] = {2 * SEQ, 2};
    KilnTensor strided = host(spread, sizeof spread, 2, row, spread_strides, KILN_DTYPE_I64);
    expect("input strided tokens", kiln_program_set_input(prefill, "tokens", &strided, sync),
           KILN_STATUS_OK);
    KilnTensor p = host(positions, sizeof positions, 2, row, NULL, KILN_DTYPE_I64);
    expect("input positions", kiln_program_set_input(prefill, "positions", &p, sync),
           KILN_STATUS_OK);
    KilnTensor c = host(cache_positions, sizeof cache_positions, 1, one, NULL, KILN_DTYPE_I64);
    expect("input cache positions", kiln_program_set_input(prefill, "cache_positions", &c, sync),
           KILN_STATUS_OK);
    expect("run prefill", kiln_program_run(prefill, sync), KILN_STATUS_OK);

    /* Outputs. */
    KilnDType dtype = -1;
    int64_t shape[4] = {0};
    uint32_t rank = 0;
    expect("output type small capacity",
           kiln_program_output_type(prefill, "logits", &dtype, shape, 1, &rank),
           KILN_STATUS_SHAPE);
    expect("output type", kiln_program_output_type(prefill, "logits", &dtype, shape, 4, &rank),
           KILN_STATUS_OK);
    int type_ok = dtype == KILN_DTYPE_F32 && rank == 2 && shape[0] == 1 && shape[1] == VOCAB;
    expect("output type is f32 [1,97]", type_ok ? 0 : 1, KILN_STATUS_OK);

    static float logits[VOCAB];
    static float untouched[VOCAB];
    for (int i = 0; i < VOCAB; i++) untouched[i] = logits[i] = -12345.0f;
    KilnTensor small = host(logits, sizeof logits - 4, 2, shape, NULL, KILN_DTYPE_F32);
    expect("output too small", kiln_program_get_output(prefill, "logits", &small, sync),
           KILN_STATUS_SHAPE);
    int64_t broadcast_strides[2] = {0, 0};
    KilnTensor overlapping =
        host(logits, sizeof logits, 2, shape, broadcast_strides, KILN_DTYPE_F32);
    expect("output overlapping", kiln_program_get_output(prefill, "logits", &overlapping, sync),
           KILN_STATUS_SHAPE);
    KilnTensor as_f64 = host(logits, sizeof logits, 2, shape, NULL, KILN_DTYPE_F64);
    expect("output wrong dtype", kiln_program_get_output(prefill, "logits", &as_f64, sync),
           KILN_STATUS_DTYPE);
    expect("nothing written on refusal",
           memcmp(logits, untouched, sizeof logits) == 0 ? 0 : 1, KILN_STATUS_OK);
    expect("output unknown name", kiln_program_get_output(prefill, "loss", &small, sync),
           KILN_STATUS_NOT_FOUND);
    KilnTensor out = host(logits, sizeof logits, 2, shape, NULL, KILN_DTYPE_F32);
    expect("output logits", kiln_program_get_output(prefill, "logits", &out, sync),
           KILN_STATUS_OK);
    int finite = 1;
    for (int i = 0; i < VOCAB; i++) finite = finite && isfinite(logits[i]);
    expect("logits finite", finite ? 0 : 1, KILN_STATUS_OK);

    FILE *file = fopen(argv[1], "wb");
    if (file == NULL || fwrite(logits, sizeof logits, 1, file) != 1 || fclose(file) != 0) {
        fprintf(stderr, "cannot write %s\n", argv[1]);
        return 2;
    }

    /* Handles. */
    pthread_t thread;
    if (pthread_create(&thread, NULL, run_elsewhere, &prefill) != 0 ||
        pthread_join(thread, NULL) != 0) {
        fprintf(stderr, "cannot run a thread\n");
        return 2;
    }
    expect("program on another thread", foreign_status == KILN_STATUS_INVALID_HANDLE ? 0 : 1,
           KILN_STATUS_OK);
    expect("message on the other thread", foreign_message ? 0 : 1, KILN_STATUS_OK);
    KilnProgram forged = {123456789};
    expect("forged program", kiln_program_run(forged, sync), KILN_STATUS_INVALID_HANDLE);
    KilnProgram zero = {0};
    expect("zero program", kiln_program_run(zero, sync), KILN_STATUS_INVALID_HANDLE);
    expect("free model", kiln_model_free(model), KILN_STATUS_OK);
    expect("program outlives its model", kiln_program_run(prefill, sync), KILN_STATUS_OK);
    expect("free model twice", kiln_model_free(model), KILN_STATUS_INVALID_HANDLE);
    expect("compile freed model", kiln_program_compile(model, "prefill", &options, &prefill),
           KILN_STATUS_INVALID_HANDLE);
    expect("free program", kiln_program_free(prefill), KILN_STATUS_OK);
    expect("run freed program", kiln_program_run(prefill, sync), KILN_STATUS_INVALID_HANDLE);
    expect("free program twice", kiln_program_free(prefill), KILN_STATUS_INVALID_HANDLE);
    expect("success clears the message",
           kiln_abi_version() && kiln_model_load("tiny", cpu, "f32", 0, &model) == 0 &&
                   kiln_last_error()[0] == '\0'
               ? 0
               : 1,
           KILN_STATUS_OK);
    kiln_model_free(model);

    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
