# Loads a Vagrantfile against a stub of the part of Vagrant's configuration API it uses, and
# prints what it configured as JSON (for tests/deploy/test_vagrant_lab.py):
#   ruby vagrant_stub.rb PATH/TO/Vagrantfile
# A method the stub does not know raises NoMethodError, so a misspelt setting fails loudly.
require "json"

module Vagrant
  def self.require_version(*requirements)
    $required_versions = requirements
  end

  def self.configure(version)
    raise ArgumentError, "configure version #{version.inspect}" unless version == "2"
    config = StubConfig.new
    yield config
    $configs << config
  end
end

# Provider blocks: record every `name = value`.
class StubProvider
  attr_reader :settings

  def initialize
    @settings = {}
  end

  def method_missing(name, *args)
    return super unless name.to_s.end_with?("=") && args.length == 1
    @settings[name.to_s.chomp("=")] = args.first
  end

  def respond_to_missing?(name, include_private = false)
    name.to_s.end_with?("=") || super
  end

  # vagrant-libvirt's serial console: `lv.serial type: ..., source: {...}`
  def serial(type:, source: nil)
    (@settings["serials"] ||= []) << { type: type, source: source }
  end
end

# config.ssh: the settings the lab uses.
class StubSSH
  attr_accessor :private_key_path, :insert_key, :username

  def to_h
    { private_key_path: private_key_path, insert_key: insert_key, username: username }
  end
end

class StubVM
  attr_accessor :box, :box_check_update, :hostname, :boot_timeout
  attr_reader :networks, :synced_folders, :provisioners, :providers, :machines

  def initialize
    @networks = []
    @synced_folders = []
    @provisioners = []
    @providers = {}
    @machines = {}
  end

  def network(type, **options)
    @networks << options.merge(type: type)
  end

  def synced_folder(source, destination, **options)
    @synced_folders << options.merge(source: source, destination: destination)
  end

  def provision(type, **options)
    @provisioners << options.merge(type: type)
  end

  def provider(name)
    provider = StubProvider.new
    yield provider
    @providers[name] = provider.settings
  end

  def define(name)
    machine = StubConfig.new
    yield machine
    @machines[name] = machine
  end

  def to_h
    { box: box, box_check_update: box_check_update, hostname: hostname,
      boot_timeout: boot_timeout, networks: networks,
      synced_folders: synced_folders, provisioners: provisioners, providers: providers,
      machines: machines.transform_values { |m| m.vm.to_h } }
  end
end

class StubConfig
  attr_reader :vm, :ssh

  def initialize
    @vm = StubVM.new
    @ssh = StubSSH.new
  end
end

$configs = []
vagrantfile = File.expand_path(ARGV.fetch(0))
Dir.chdir(File.dirname(vagrantfile)) { load vagrantfile }
puts JSON.generate(required_versions: $required_versions,
                   configs: $configs.map { |c| c.vm.to_h.merge(ssh: c.ssh.to_h) })
