/*
 * The main class of the job-server launchers `make engines` writes (deploy/engine_launcher.py):
 * starts the Beam job server that the launcher's manifest names (Job-Server-Driver), with every
 * gRPC server it opens bound to the address of its --job-host flag (default: localhost).
 *
 * Why: Beam's job servers (JobServerDriver) create their job and artifact services through
 * ServerFactory.createWithPortSupplier, whose servers listen on NettyServerBuilder.forPort(port),
 * that is on every interface, whatever --job-host says (the flag only sets the address they
 * advertise). Here the driver is built from the same flags by its own fromParams, and its two
 * server factories are replaced, before it starts, by HostBound, which listens on the --job-host
 * address only. Everything else (the flags, the job service, the engine) is the driver's own.
 * The expansion service already binds --job-host (ExpansionServer.create(service, host, port)).
 *
 * A launcher whose manifest has Flink-Conf-Dir (a directory beside the jar) starts the driver with
 * --flink-conf-dir set to it unless the command line names one: the embedded Flink's own servers
 * (its BlobServer reads jobmanager.bind-host) are configured there.
 *
 * Written for this project; compiled by `make engines` against the closure in lib/.
 */
package beam_pretokenize.engines;

import java.io.File;
import java.io.IOException;
import java.lang.reflect.Field;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.jar.Attributes;
import java.util.jar.JarFile;
import org.apache.beam.model.pipeline.v1.Endpoints.ApiServiceDescriptor;
import org.apache.beam.runners.jobsubmission.JobServerDriver;
import org.apache.beam.sdk.fn.server.GrpcContextHeaderAccessorProvider;
import org.apache.beam.sdk.fn.server.ServerFactory;
import org.apache.beam.sdk.io.FileSystems;
import org.apache.beam.sdk.options.PipelineOptionsFactory;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.BindableService;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.Server;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.ServerInterceptors;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.netty.NettyServerBuilder;

public final class HostBoundJobServer {
  /** The launcher's manifest attribute naming the driver class, e.g. FlinkJobServerDriver. */
  static final String DRIVER_ATTRIBUTE = "Job-Server-Driver";
  /** The manifest attribute naming the Flink configuration directory, relative to the launcher. */
  static final String FLINK_CONF_ATTRIBUTE = "Flink-Conf-Dir";

  private HostBoundJobServer() {}

  public static void main(String[] args) throws Exception {
    // As the drivers' own main does before it builds the driver.
    FileSystems.setDefaultPipelineOptions(PipelineOptionsFactory.create());
    File launcher = new File(HostBoundJobServer.class.getProtectionDomain().getCodeSource().getLocation().toURI());
    Attributes manifest;
    try (JarFile jar = new JarFile(launcher)) {
      manifest = jar.getManifest().getMainAttributes();
    }
    String driverClass = manifest.getValue(DRIVER_ATTRIBUTE);
    if (driverClass == null) {
      throw new IllegalStateException(launcher + ": its manifest names no " + DRIVER_ATTRIBUTE);
    }
    String flinkConf = manifest.getValue(FLINK_CONF_ATTRIBUTE);
    if (flinkConf != null && !Arrays.asList(args).contains("--flink-conf-dir")) {
      List<String> withConf = new ArrayList<>(Arrays.asList(args));
      withConf.add("--flink-conf-dir");
      withConf.add(new File(launcher.getParentFile(), flinkConf).getPath());
      args = withConf.toArray(new String[0]);
    }
    JobServerDriver driver =
        (JobServerDriver)
            Class.forName(driverClass).getMethod("fromParams", String[].class).invoke(null, (Object) args);
    InetAddress host = InetAddress.getByName(driver.configuration.getHost());
    for (String name : new String[] {"jobServerFactory", "artifactServerFactory"}) {
      Field field = JobServerDriver.class.getDeclaredField(name);
      field.setAccessible(true);
      field.set(driver, new HostBound(host));
    }
    driver.run();
  }

  /** gRPC servers listening on one address, as Beam's default factory makes them otherwise. */
  static final class HostBound extends ServerFactory {
    private final InetAddress host;

    HostBound(InetAddress host) {
      this.host = host;
    }

    @Override
    public Server allocateAddressAndCreate(
        List<BindableService> services, ApiServiceDescriptor.Builder descriptor) throws IOException {
      Server server = start(services, 0);
      String address = host.getHostAddress();
      descriptor.setUrl((address.contains(":") ? "[" + address + "]" : address) + ":" + server.getPort());
      return server;
    }

    @Override
    public Server create(List<BindableService> services, ApiServiceDescriptor descriptor)
        throws IOException {
      String url = descriptor.getUrl();
      return start(services, Integer.parseInt(url.substring(url.lastIndexOf(':') + 1)));
    }

    private Server start(List<BindableService> services, int port) throws IOException {
      NettyServerBuilder builder =
          NettyServerBuilder.forAddress(new InetSocketAddress(host, port))
              .maxInboundMessageSize(Integer.MAX_VALUE)
              .permitKeepAliveTime(20, TimeUnit.SECONDS);
      for (BindableService service : services) {
        builder.addService(
            ServerInterceptors.intercept(service, GrpcContextHeaderAccessorProvider.interceptor()));
      }
      return builder.build().start();
    }
  }
}
