/* tests/losses/loss_c_abi_test.c: the loss plugins through the C ABI.
 *
 * A plain C11 program: it links librl, loads the built plugins from
 * RL_TEST_PLUGIN_DIR (rl_runtime_create, no default plugin folders), runs the
 * fixed inputs of loss_fixtures.h through rl_loss_compute and checks the loss,
 * the gradients, the extra tensors and the metrics equal what the C++ path
 * (the plugin classes through the SDK test host) produced. It also checks that
 * forward-only calls give no gradients and that refusals reach rl_last_error. */
#include <rl_api.h>

#include "loss_fixtures.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            ++failures;                                                                            \
        }                                                                                          \
    } while (0)

static int close_to(double got, double want) {
    return fabs(got - want) <= 1e-12 * (1.0 + fabs(want));
}

static rl_tensor_view_t view_of(void *data, int is_int, int64_t *shape) {
    rl_tensor_view_t v;
    memset(&v, 0, sizeof(v));
    v.data = *shape ? data : NULL;
    v.device.type = RL_DEVICE_CPU;
    v.device.index = 0;
    v.ndim = 1;
    v.dtype.code = is_int ? RL_DTYPE_INT : RL_DTYPE_FLOAT;
    v.dtype.bits = 64;
    v.dtype.lanes = 1;
    v.shape = shape;
    v.strides = NULL;
    v.byte_offset = 0;
    return v;
}

static double element(const rl_tensor_view_t *v, int64_t i) {
    const char *base = (const char *)v->data + v->byte_offset;
    if (v->dtype.code == RL_DTYPE_FLOAT && v->dtype.bits == 64) return ((const double *)base)[i];
    if (v->dtype.code == RL_DTYPE_FLOAT && v->dtype.bits == 32) return ((const float *)base)[i];
    return NAN;
}

/* Compares a result tensor with the expected values. */
static void check_tensor(const rl_result_t *res, const char *name, const double *want, int64_t n,
                         const lf_case *c) {
    rl_tensor_view_t v;
    if (rl_result_tensor(res, name, &v) != RL_OK) {
        CHECK(0, "%s: no result tensor '%s' (%s)", c->name, name, rl_last_error());
        return;
    }
    CHECK(v.ndim == 1 && v.shape[0] == n, "%s: tensor '%s' has the wrong shape", c->name, name);
    if (v.ndim != 1 || v.shape[0] != n) return;
    for (int64_t t = 0; t < n; ++t)
        CHECK(close_to(element(&v, t), want[t]), "%s %s: %s[%lld] = %.17g, want %.17g", c->name,
              c->params, name, (long long)t, element(&v, t), want[t]);
}

static void run_case(rl_runtime_t *rt, const lf_case *c) {
    rl_instance_t *inst = NULL;
    if (rl_instance_create(rt, "loss", c->name, c->params, &inst) != RL_OK) {
        CHECK(0, "%s: rl_instance_create failed: %s", c->name, rl_last_error());
        return;
    }
    int64_t n = c->n_tokens, n_cu = c->n_cu;
    rl_tensor_arg_t args[32];
    CHECK(c->n_inputs <= 32, "too many inputs");
    for (int i = 0; i < c->n_inputs && i < 32; ++i) {
        const lf_tensor *x = &c->inputs[i];
        args[i].name = x->name;
        args[i].view = view_of(x->is_int ? (void *)x->i : (void *)x->f, x->is_int, &n);
    }
    rl_loss_inputs_t in;
    memset(&in, 0, sizeof(in));
    in.struct_size = sizeof(in);
    in.tensors.items = args;
    in.tensors.count = (uint64_t)c->n_inputs;
    in.cu_seqlens = view_of((void *)c->cu_seqlens, 1, &n_cu);
    in.global_tokens = c->global_tokens;
    in.global_seqs = c->global_seqs;

    rl_result_t *res = NULL;
    if (rl_loss_compute(inst, &in, 1, &res) != RL_OK) {
        CHECK(0, "%s %s: rl_loss_compute failed: %s", c->name, c->params, rl_last_error());
        rl_instance_destroy(inst);
        return;
    }
    double loss = NAN;
    CHECK(rl_result_scalar(res, "loss", &loss) == RL_OK, "%s: no scalar 'loss'", c->name);
    CHECK(close_to(loss, c->loss), "%s %s: loss %.17g, want %.17g", c->name, c->params, loss,
          c->loss);
    for (int i = 0; i < c->n_grads; ++i) {
        char name[128];
        snprintf(name, sizeof(name), "grad.%s", c->grads[i].name);
        check_tensor(res, name, c->grads[i].f, n, c);
    }
    for (int i = 0; i < c->n_outputs; ++i)
        check_tensor(res, c->outputs[i].name, c->outputs[i].f, n, c);
    for (int i = 0; i < c->n_metrics; ++i) {
        double m = NAN;
        if (rl_result_metric(res, c->metrics[i].name, &m) != RL_OK) {
            CHECK(0, "%s: no metric '%s'", c->name, c->metrics[i].name);
            continue;
        }
        CHECK(close_to(m, c->metrics[i].value), "%s %s: metric %s = %.17g, want %.17g", c->name,
              c->params, c->metrics[i].name, m, c->metrics[i].value);
    }
    rl_result_destroy(res);

    /* Forward only: the same loss, no gradient tensors. */
    res = NULL;
    if (rl_loss_compute(inst, &in, 0, &res) == RL_OK) {
        rl_tensor_view_t v;
        CHECK(rl_result_scalar(res, "loss", &loss) == RL_OK && close_to(loss, c->loss),
              "%s: forward-only loss differs", c->name);
        for (int i = 0; i < c->n_grads; ++i) {
            char name[128];
            snprintf(name, sizeof(name), "grad.%s", c->grads[i].name);
            CHECK(rl_result_tensor(res, name, &v) == RL_ERR_NOT_FOUND,
                  "%s: forward-only call returned '%s'", c->name, name);
        }
        rl_result_destroy(res);
    } else {
        CHECK(0, "%s: forward-only rl_loss_compute failed: %s", c->name, rl_last_error());
    }
    rl_instance_destroy(inst);
}

/* Refusals cross the C ABI with a message naming what is wrong. */
static void check_refusals(rl_runtime_t *rt) {
    rl_instance_t *inst = NULL;
    rl_status_t s = rl_instance_create(rt, "loss", "policy_loss", "{\"eps_clp\": 0.1}", &inst);
    CHECK(s == RL_ERR_INVALID_ARG, "unknown parameter: status %d", (int)s);
    CHECK(strstr(rl_last_error(), "eps_clp") && strstr(rl_last_error(), "eps_clip_high"),
          "unknown parameter message: %s", rl_last_error());
    CHECK(inst == NULL, "instance set on failure");

    s = rl_instance_create(rt, "loss", "policy_loss", "{\"eps_clip_c\": 0.5}", &inst);
    CHECK(s == RL_ERR_INVALID_ARG && strstr(rl_last_error(), "eps_clip_c"),
          "out-of-range parameter: %d %s", (int)s, rl_last_error());

    s = rl_instance_create(rt, "loss", "importance_sampling", "{}", &inst);
    CHECK(s == RL_OK, "importance_sampling: %s", rl_last_error());
    if (s != RL_OK) return;
    double lp[3] = {-1.0, NAN, -0.5}, old[3] = {-1.0, -1.0, -1.0}, adv[3] = {1.0, 1.0, 1.0};
    int64_t cu[2] = {0, 3}, n = 3, n_cu = 2;
    rl_tensor_arg_t args[3];
    args[0].name = "logprobs";
    args[0].view = view_of(lp, 0, &n);
    args[1].name = "old_logprobs";
    args[1].view = view_of(old, 0, &n);
    args[2].name = "advantages";
    args[2].view = view_of(adv, 0, &n);
    rl_loss_inputs_t in;
    memset(&in, 0, sizeof(in));
    in.struct_size = sizeof(in);
    in.tensors.items = args;
    in.tensors.count = 3;
    in.cu_seqlens = view_of(cu, 1, &n_cu);
    rl_result_t *res = NULL;
    s = rl_loss_compute(inst, &in, 1, &res);
    CHECK(s == RL_ERR_NUMERIC && strstr(rl_last_error(), "logprobs") &&
              strstr(rl_last_error(), "NaN"),
          "NaN input: %d %s", (int)s, rl_last_error());
    CHECK(res == NULL, "result set on failure");
    in.tensors.count = 2; /* drop advantages */
    lp[1] = -2.0;
    s = rl_loss_compute(inst, &in, 1, &res);
    CHECK(s == RL_ERR_INVALID_ARG && strstr(rl_last_error(), "advantages"), "missing input: %d %s",
          (int)s, rl_last_error());
    rl_instance_destroy(inst);
}

int main(void) {
    rl_runtime_desc_t desc = RL_RUNTIME_DESC_INIT;
    desc.flags = RL_RUNTIME_NO_DEFAULT_PLUGINS;
    desc.plugin_path = RL_TEST_PLUGIN_DIR;
    desc.log_level = "error";
    rl_runtime_t *rt = NULL;
    if (rl_runtime_create(&desc, &rt) != RL_OK) {
        fprintf(stderr, "rl_runtime_create failed: %s\n", rl_last_error());
        return 1;
    }
    for (int k = 0; k < LF_N_CASES; ++k) run_case(rt, &lf_cases[k]);
    check_refusals(rt);
    rl_runtime_destroy(rt);
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("loss_c_abi_test: %d fixture cases passed through the C ABI\n", LF_N_CASES);
    return 0;
}
