"""Conjugate and negative views (PyTorch's math bits) on dipu give the CPU's values.

Each check runs in a subprocess: before the fix, resolving a conjugate view recursed until the
process died with SIGSEGV.
"""


def assert_runs_and_matches_cpu(python_in_subprocess, body):
    result = python_in_subprocess("""
        import torch, ditorch
        from torch.testing import assert_close
        torch.manual_seed(0)
    """ + body + """
        print("matches")
    """)
    assert result.returncode == 0, f"exit status {result.returncode}: {result.stderr[-2000:]}"
    assert result.stdout.strip().endswith("matches")


def test_resolving_a_conjugate_view_conjugates_the_values(python_in_subprocess):
    assert_runs_and_matches_cpu(
        python_in_subprocess, """
        x = torch.randn(3, 4, dtype=torch.complex64)
        on_device = x.to("dipu").conj().resolve_conj()
        assert not on_device.is_conj()
        assert_close(on_device.cpu(), x.conj().resolve_conj())
    """)


def test_copies_between_conjugate_and_negative_views_keep_the_values(python_in_subprocess):
    assert_runs_and_matches_cpu(
        python_in_subprocess, """
        x = torch.randn(5, dtype=torch.complex128)
        d = x.to("dipu")
        assert_close(d.conj().cpu(), x.conj())
        assert_close(d.conj().imag.clone().cpu(), x.conj().imag.clone())
        host_conjugate_view = torch.zeros(5, dtype=torch.complex128).conj()
        host_conjugate_view.copy_(d)
        assert_close(host_conjugate_view.resolve_conj(), x)
        device_conjugate_view = torch.zeros(5, dtype=torch.complex128, device="dipu").conj()
        device_conjugate_view.copy_(x.conj())
        assert_close(device_conjugate_view.cpu(), x.conj())
    """)


def test_matrix_products_of_conjugate_views_match_the_cpu(python_in_subprocess):
    assert_runs_and_matches_cpu(
        python_in_subprocess, """
        a = torch.randn(3, 3, dtype=torch.complex64)
        b = torch.randn(3, 3, dtype=torch.complex64)
        assert_close(torch.mm(a.to("dipu").conj(), b.to("dipu")).cpu(), torch.mm(a.conj(), b))
        assert_close(torch.dot(a[0].to("dipu").conj(), b[0].to("dipu")).cpu(), torch.dot(a[0].conj(), b[0]))
    """)


def test_complex_fft_matches_the_cpu(python_in_subprocess):
    assert_runs_and_matches_cpu(
        python_in_subprocess, """
        x = torch.randn(8, dtype=torch.complex64)
        assert_close(torch.fft.ifft(x.to("dipu")).cpu(), torch.fft.ifft(x))
        assert_close(torch.fft.hfft(x.to("dipu")).cpu(), torch.fft.hfft(x))
    """)


def test_polar_backward_matches_the_cpu(python_in_subprocess):
    assert_runs_and_matches_cpu(
        python_in_subprocess, """
        def polar_gradients(device):
            abs_ = torch.rand(6, dtype=torch.float64).to(device).requires_grad_()
            angle = torch.linspace(-3, 3, 6, dtype=torch.float64).to(device).requires_grad_()
            upstream = torch.randn(6, dtype=torch.complex128).to(device)
            grads = torch.autograd.grad(torch.polar(abs_, angle), (abs_, angle), grad_outputs=upstream)
            return [g.cpu() for g in grads]
        torch.manual_seed(1)
        cpu = polar_gradients("cpu")
        torch.manual_seed(1)
        assert_close(polar_gradients("dipu"), cpu)
    """)
